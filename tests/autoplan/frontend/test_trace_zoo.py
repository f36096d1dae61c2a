"""Acceptance tests of traced zoo / spec models: FLOPs, activation memory, blocks, dim roles."""
from __future__ import annotations

import dataclasses

import pytest

from autoplan.frontend import trace

SMALL_GPT = "gpt:layers=2,hidden=64,heads=4,vocab=128"


def korthikanti_flops_per_token(l: int, h: int, s: int, V: int) -> float:
    """Model FLOPs per token, fwd+bwd, full s² attention: 72·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    return 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def test_gpt3_175b_flops_per_token(traced):
    g = traced("gpt3-175b")
    m = g.model
    expected = korthikanti_flops_per_token(m.layers, m.hidden, g.seq_len, m.vocab)
    # torch counts full s² attention (no causal discount) and the flash backward's recomputed
    # QKᵀ (2·s²·h per layer, +0.46 % here); pointwise ops add < 0.1 %.
    assert g.flops_per_token == pytest.approx(expected, rel=0.02)
    assert g.param_count == pytest.approx(174.6e9, rel=0.005)


def test_eager_gpt_flops_equal_formula(traced):
    """Eager attention has no recompute: only pointwise ops separate it from the formula."""
    g = traced("gpt:layers=2,hidden=1024,heads=16,vocab=51200,attention=eager", seq=1024)
    expected = korthikanti_flops_per_token(2, 1024, 1024, 51200)
    assert g.flops_per_token == pytest.approx(expected, rel=0.02)


def llama_flops_per_token(l, h, a, g, d, f, V, s) -> float:
    """Megatron's 2024 formula (num_floating_point_operations) per token, fwd+bwd:

        12·l·h²·[(1 + g/a + s/h)·(a·d/h) + (f/h)·(3/2) + V/(2·l·h)]

    Per layer and token, forward: q and o projections 2·2·h·(a·d), k and v 2·2·h·(g·d),
    attention QKᵀ and PV 2·2·s·(a·d) (full s²), SwiGLU 3 matrices 2·3·h·f; logits 2·h·V.
    Backward = 2× forward, so ×3: 12·h·(a·d)·(1 + g/a + s/h) + 18·h·f + 6·h·V/l.
    """
    return 12 * l * h * h * ((1 + g / a + s / h) * (a * d / h) + (f / h) * 1.5 + V / (2 * l * h))


def test_llama3_8b_flops_and_params(traced):
    g = traced("llama3-8b")
    m = g.model
    expected = llama_flops_per_token(m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab,
                                     g.seq_len)
    assert g.flops_per_token == pytest.approx(expected, rel=0.02)
    assert g.param_count == pytest.approx(8.03e9, rel=0.005)


@pytest.mark.parametrize("name, billions", [("llama3-70b", 70.6), ("llama3-405b", 405.9)])
def test_llama3_params_from_trace(traced, name, billions):
    assert traced(name).param_count == pytest.approx(billions * 1e9, rel=0.005)


def test_korthikanti_activation_memory_eager():
    """Eager attention with dropout: saved bytes per layer = s·b·h·(34 + 5·a·s/h) within 5 %."""
    g = trace("gpt:layers=2,hidden=2048,heads=16,vocab=51200,attention=eager", seq=2048)
    s, h, a = 2048, 2048, 16
    expected = s * h * (34 + 5 * a * s / h)
    assert g.blocks[0].graph.saved_bytes() == pytest.approx(expected, rel=0.05)


def test_flash_activation_memory_is_34_sbh(traced):
    g = traced("gpt3-175b")
    s, h = g.seq_len, g.model.hidden
    assert g.blocks[0].graph.saved_bytes() == pytest.approx(34 * s * h, rel=0.05)


def test_dense_then_moe_blocks(traced):
    g = traced("moe:layers=4,hidden=64,heads=4,kv_heads=2,vocab=128,experts=4,topk=2,moe_ffn=32,ffn=96,"
               "dense_layers=1,shared_experts=1", seq=64)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 1), ("moe0", 3)]
    assert g.order == ("dense0", "moe0", "moe0", "moe0")
    assert g.block("moe0").module_paths == ("layers.1", "layers.2", "layers.3")
    assert "MoE (4 experts, top-2 + 1 shared)" in g.block("moe0").description


def test_deepseek_v3_kinds(traced):
    g = traced("deepseek-v3")
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 3), ("moe0", 58)]
    # 671 B main model + the MTP module (an MoE layer and its projection: 11.6 B), traced in post with the
    # shared embedding (counted once) and its expert weights as experts
    assert g.param_count == pytest.approx(682.6e9, rel=0.001)
    assert g.post.param_count - g.pre.param_count == pytest.approx(11.6e9 + 129280 * 7168, rel=0.005)
    mtp_experts = [n for n in g.post.params() if n.param.startswith("mtp.1.block.moe.routed.")]
    assert len(mtp_experts) == 3 and all(n.out.dim_roles[0] == "expert" for n in mtp_experts)


def test_expert_dims(traced):
    g = traced("moe:layers=1,hidden=64,heads=4,kv_heads=2,vocab=128,experts=4,topk=2,moe_ffn=32", seq=64)
    graph = g.blocks[0].graph
    w = next(n for n in graph.params() if n.param == "moe.routed.w_gate")
    assert w.out.dim_roles == ("expert", "", "")
    bmm = next(n for n in graph.ops("forward") if n.op == "aten.bmm.default")
    assert bmm.out.dim_roles == ("expert", "tokens", "")     # [experts, capacity, ffn]
    router = next(n for n in graph.ops("forward") if n.module == "moe.router" and n.gemm)
    assert router.out.dim_roles == ("tokens", "expert")


def test_dim_roles_when_seq_equals_hidden(traced):
    g = traced(SMALL_GPT, seq=64)            # hidden 64 == seq 64
    graph = g.blocks[0].graph
    x = next(n for n in graph.nodes if n.role == "input")
    assert x.out.shape == (1, 64, 64) and x.out.dim_roles == ("batch", "seq", "")
    mm = next(n for n in graph.ops("forward") if n.gemm and n.module == "attn.q_proj")
    assert mm.out.shape == (64, 64) and mm.out.dim_roles == ("tokens", "")
    w = next(n for n in graph.params() if n.param == "attn.q_proj.weight")
    assert w.out.dim_roles == ("", "")
    flash = next(n for n in graph.ops() if n.op == "aten._scaled_dot_product_flash_attention.default")
    assert flash.outputs[0].dim_roles == ("batch", "", "seq", "")


def test_batch_dims_at_batch_2(traced):
    g = traced(SMALL_GPT, seq=32, batch=2)
    x = next(n for n in g.blocks[0].graph.nodes if n.role == "input")
    assert x.out.shape == (2, 32, 64) and x.out.dim_roles == ("batch", "seq", "")
    assert g.batch == 2
    one = traced(SMALL_GPT, seq=32)
    assert g.flops_per_token == pytest.approx(one.flops_per_token, rel=0.01)  # param-sized ops do not scale


def test_block_graph_is_independent_of_depth(traced):
    a = traced("llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128", seq=32)
    b = traced("llama:layers=6,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128", seq=32)
    assert a.blocks[0].graph == b.blocks[0].graph
    assert (a.num_layers, b.num_layers) == (2, 6)


def _without_timing(g):
    return dataclasses.replace(g, trace_seconds=0.0, trace_peak_rss_bytes=0)


def test_same_input_gives_byte_identical_json(monkeypatch):
    monkeypatch.setenv("AUTOPLAN_NO_CACHE", "1")
    spec = "moe:layers=2,hidden=64,heads=4,kv_heads=2,vocab=128,experts=4,topk=2,moe_ffn=32,dense_layers=1"
    first = _without_timing(trace(spec, seq=32)).to_json()
    second = _without_timing(trace(spec, seq=32)).to_json()
    assert first == second


def test_json_round_trip(traced):
    from autoplan.ir import BlockGraph

    g = traced(SMALL_GPT, seq=32)
    again = BlockGraph.from_json(g.to_json())
    assert again == g and again.to_json() == g.to_json()


def test_cache_hit_and_disable(monkeypatch):
    from autoplan.frontend.tracing import trace_with_status

    spec = "gpt:layers=1,hidden=32,heads=2,vocab=64"
    g1, cached1 = trace_with_status(spec, seq=16)
    g2, cached2 = trace_with_status(spec, seq=16)
    assert (cached1, cached2) == (False, True) and g1.to_json() == g2.to_json()
    monkeypatch.setenv("AUTOPLAN_NO_CACHE", "1")
    assert trace_with_status(spec, seq=16)[1] is False
