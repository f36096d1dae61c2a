"""The IR: JSON round trip, saved bytes per output, batch-aware FLOPs, older JSON still loads."""
from __future__ import annotations

import json

from autoplan.ir import Block, BlockGraph, ModelInfo, OpGraph, OpNode, Strategy, TensorInfo, TensorRef


def _graph(batch: int = 1) -> OpGraph:
    x = OpNode("x", "placeholder", (), (TensorInfo((batch, 8, 4), "bf16", ("batch", "seq", "")),),
               role="input", saved=True)
    w = OpNode("w", "placeholder", (), (TensorInfo((4, 4), "bf16", ("", "")),), role="param", param="w",
               saved=True)
    drop = OpNode("drop", "aten.native_dropout.default", (TensorRef("x"),),
                  (TensorInfo((batch, 8, 4), "bf16", ("batch", "seq", "")),
                   TensorInfo((batch, 8, 4), "bool", ("batch", "seq", ""))),
                  flops=32.0 * batch, saved=True, saved_outputs=(1,),
                  strategies=(Strategy(("R",), ("R", "R")), Strategy(("S(1)",), ("S(1)", "S(1)"))))
    out = OpNode("output", "output", (TensorRef("drop", 0),), (), role="output")
    return OpGraph((x, w, drop, out), seq_len=8, output_roles=("activation",), batch=batch)


def test_saved_bytes_counts_only_saved_outputs():
    g = _graph()
    # x: 8·4·2 bytes, drop: only its 1-byte mask (8·4); the param is not an activation
    assert g.saved_bytes() == 64 + 32


def test_round_trip_and_batch():
    g2 = _graph(batch=2)
    bg = BlockGraph(model=ModelInfo("m", notes=("n",)), blocks=(Block("dense0", g2, 3, ("l.0", "l.1", "l.2")),),
                    order=("dense0",) * 3, pre=_graph(2), post=_graph(2), seq_len=8, batch=2)
    again = BlockGraph.from_json(bg.to_json())
    assert again == bg and again.to_json() == bg.to_json()
    assert bg.flops_per_step_per_sample() == (32 + 32 + 3 * 32)      # per sample: divided by batch


def test_json_without_new_fields_loads():
    d = json.loads(BlockGraph(model=ModelInfo("m"), blocks=(), order=(), pre=_graph(), post=_graph(),
                              seq_len=8).to_json())
    d.pop("batch")
    for graph in (d["pre"], d["post"]):
        graph.pop("batch")
        for n in graph["nodes"]:
            n.pop("saved_outputs")
    old = BlockGraph.from_json(json.dumps(d))
    assert old.batch == 1 and old.pre.batch == 1
    # without saved_outputs a saved node counts all its outputs
    assert old.pre.saved_bytes() == 64 + 64 + 32
