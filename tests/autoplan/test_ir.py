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


def _traced(spec: str):
    from autoplan.frontend.tracing import trace
    return trace(spec, seq=64)


def _ops(g: OpGraph, names) -> list[str]:
    return sorted(g.node(n).op for n in names)


def test_a_split_backward_holds_every_weight_ops_output_gradient():
    """What W reads besides the saved activations: the gradient into each of a GPT block's four
    linears (qkv as the attention backward's dq, dk, dv; proj and fc2 through their dropouts; fc1
    through GELU) and into each LayerNorm, whose backward returns dγ, dβ beside dX."""
    g = _traced("gpt:layers=2,hidden=64,heads=4,vocab=128").blocks[0].graph
    assert _ops(g, g.fused_wgrad_nodes()) == ["aten.native_layer_norm_backward.default"] * 2
    held = g.wgrad_held_outputs()
    producers = sorted(g.node(r.node).op.split(".")[1] for r in held)
    assert producers.count("_scaled_dot_product_flash_attention_backward") == 3
    assert producers.count("native_dropout_backward") == 2 and producers.count("gelu_backward") == 1
    def base(r: TensorRef) -> TensorRef:               # a view of dY keeps dY
        return base(g.node(r.node).inputs[0]) if g.node(r.node).is_view else r

    norm_inputs = {base(r) for n in g.fused_wgrad_nodes() for r in g.node(n).inputs
                   if g.node(r.node).phase == "backward"}
    assert len(norm_inputs) == 2 and norm_inputs <= held
    assert all(g.node(r.node).phase == "backward" and not g.node(r.node).wgrad for r in held)


def test_a_split_backward_frees_the_loss_at_its_input_half():
    """Above the LM head nothing a weight gradient needs: B frees the loss's log-softmax output
    (torch detaches the stage output after B), while a block keeps all it saves but the tail of its
    last residual branch (a GPT block's second dropout mask; a llama block nothing)."""
    gpt = _traced("gpt:layers=2,hidden=64,heads=4,vocab=128")
    post = gpt.post
    freed = post.freed_at_input_grad_nodes()
    assert "aten._log_softmax.default" in _ops(post, freed)
    assert not any(post.node(n).gemm for n in freed)
    assert _ops(gpt.blocks[0].graph, gpt.blocks[0].graph.freed_at_input_grad_nodes()) == \
        ["aten.native_dropout.default"]
    llama = _traced("llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128").blocks[0].graph
    assert llama.freed_at_input_grad_nodes() == frozenset()


def test_a_weight_gradient_store_keeps_each_linears_input():
    """Megatron's WeightGradStore (the Zero Bubble fork) keeps from B to W only the input X of each
    linear's dW = dYᵀ·X: a GPT block's four — the two LayerNorm outputs (qkv, fc1), the attention
    output (proj) and the GELU output (fc2) — 7·h elements per token, whatever the attention."""
    for attention in ("flash", "eager"):
        g = _traced(f"gpt:layers=2,hidden=64,heads=4,vocab=128,attention={attention}").blocks[0].graph
        kept = g.wgrad_input_nodes()
        ops = sorted(g.node(n).op.split(".")[1] for n in kept)
        assert ops.count("native_layer_norm") == 2 and ops.count("gelu") == 1 and len(ops) == 4
        assert sum(g.node(n).outputs[0].numel for n in kept) == 64 * (64 + 64 + 64 + 256)   # s·7h
        assert kept <= {r.node for r in g.saved_outputs()}
