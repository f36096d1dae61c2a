"""IR conventions of a traced block: roles, phases, saved values, wgrad, modules, strategies."""
from __future__ import annotations

import pytest

GPT = "gpt:layers=2,hidden=64,heads=4,vocab=128"
LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128"


@pytest.fixture(scope="module")
def gpt_block(traced):
    return traced(GPT, seq=32).blocks[0].graph


def test_placeholders_and_output_roles(gpt_block):
    g = gpt_block
    params = g.params()
    assert {n.param for n in params} >= {"ln_1.weight", "attn.q_proj.weight", "mlp.down_proj.bias"}
    assert all(n.module == n.param.rpartition(".")[0] for n in params)
    [x] = [n for n in g.nodes if n.role == "input"]
    [tangent] = [n for n in g.nodes if n.role == "tangent"]
    assert tangent.phase == "backward" and x.phase == "forward"
    out = g.nodes[-1]
    assert out.op == "output" and len(out.inputs) == len(g.output_roles)
    assert g.output_roles[0] == "activation"
    assert sum(r.startswith("param_grad:") for r in g.output_roles) == len(params)
    assert f"input_grad:{x.name}" in g.output_roles
    for ref, role in zip(out.inputs, g.output_roles):
        if role.startswith("param_grad:"):
            producer = g.node(ref.node)
            placeholder = g.node(role.split(":", 1)[1])
            assert g.tensor(ref).shape == placeholder.out.shape
            if len(producer.outputs) == 1:      # a multi-output op (norm backward) keeps role "grad"
                assert producer.role == "param_grad" and producer.param == placeholder.param


def test_phases_wgrad_and_modules(gpt_block):
    g = gpt_block
    mms = [n for n in g.ops("backward") if n.gemm and n.module == "mlp.up_proj"]
    assert len(mms) == 2                                  # dgrad and wgrad of the up projection
    assert sorted(n.wgrad for n in mms) == [False, True]
    assert all(n.module for n in g.ops("forward") if n.gemm)
    assert not any(n.wgrad for n in g.ops("forward"))
    assert g.flops("backward") == pytest.approx(2 * g.flops("forward"), rel=0.15)


def test_saved_values_follow_views_to_storage(gpt_block):
    g = gpt_block
    assert not any(n.saved for n in g.nodes if n.is_view)
    drop = next(n for n in g.ops("forward") if n.op == "aten.native_dropout.default")
    assert drop.saved_outputs == (1,) and drop.outputs[1].dtype == "bool"   # the 1-byte mask only
    x = next(n for n in g.nodes if n.role == "input")
    assert x.saved                                                       # LayerNorm backward reads it
    assert all(n.phase == "forward" for n in g.nodes if n.saved)


def test_costs_and_views(gpt_block):
    g = gpt_block
    for n in g.ops():
        if n.is_view:
            assert n.bytes_read == n.bytes_written == n.flops == 0
    q = next(n for n in g.ops("forward") if n.module == "attn.q_proj" and n.gemm)
    assert q.gemm == (32, 64, 64) and q.flops == 2 * 32 * 64 * 64


def test_strategies_on_every_node(gpt_block):
    g = gpt_block
    for n in g.nodes:
        if n.op == "output":
            continue
        assert n.strategies, n.name
        assert n.strategies[0].inputs == ("R",) * len(n.inputs)              # all-replicate first
        for s in n.strategies:
            assert len(s.inputs) == len(n.inputs) and len(s.outputs) == len(n.outputs)
            assert all(p in ("R", "P", None) or p.startswith("S(") for p in s.inputs + s.outputs)
    flash = next(n for n in g.ops() if "flash_attention.default" in n.op)
    assert any(s.inputs == ("S(1)",) * 3 for s in flash.strategies)            # shard heads


def test_no_fallbacks_for_zoo_dense_models(traced):
    for spec in (GPT, LLAMA):
        g = traced(spec, seq=32)
        assert not any("fell back" in note for note in g.model.notes), g.model.notes


def test_llama_side_inputs_and_fused_norm(traced):
    g = traced(LLAMA, seq=32).blocks[0].graph
    roles = sorted(n.role for n in g.nodes if n.op == "placeholder" and n.role not in ("param",))
    assert roles == ["input", "side_input", "side_input", "tangent"]       # x, rotary cos/sin, grad
    norms = [n for n in g.ops("forward") if n.op == "aten._fused_rms_norm.default"]
    assert len(norms) == 2 and norms[0].outputs[1].dtype == "fp32"


def test_post_region_has_the_loss(traced):
    post = traced(GPT, seq=32).post
    [loss] = [n for n in post.nodes if n.role == "loss"]
    assert loss.op == "aten.nll_loss_forward.default" and loss.module == "loss"
    assert {n.param for n in post.params()} == {"wte.weight", "ln_f.weight", "ln_f.bias"}
    assert not any(n.op == "aten.embedding.default" for n in post.nodes)     # dead pre ops removed
