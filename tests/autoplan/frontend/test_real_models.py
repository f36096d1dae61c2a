"""Real models from their transformers configs (no download): exact parameter counts and attention
as the kernels run it.

Each ``models/real/<name>.py`` builds the real model at ``TEST_LAYERS`` layers; the trace's
per-layer parameters are the real ones, so the full model's count is the traced count plus each
block kind's parameters times the layers it is short of (``FULL_KINDS``), checked against the
published count and against the real-depth model built on the meta device.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")

REAL = Path(__file__).parent / "models" / "real"
SEQ = 256

# name: (published parameter count or None, block kinds of the real-depth model, attention kernel)
FULL_KINDS = {
    "llama31_8b": (8_030_261_248, {"dense0": 32}, "flash"),
    "qwen25_7b": (7_615_616_512, {"dense0": 28}, "flash"),
    "qwen25_14b": (14_770_033_664, {"dense0": 48}, "flash"),
    "mistral_7b": (7_241_732_096, {"dense0": 32}, "flash"),
    "gemma2_9b": (9_241_705_984, {"dense0": 21, "dense1": 21}, "eager"),
    "mixtral_8x7b": (46_702_792_704, {"moe0": 32}, "flash"),
    "qwen15_moe": (14_315_784_192, {"moe0": 24}, "flash"),
    "qwen3_30b_a3b": (30_532_122_624, {"moe0": 48}, "flash"),
    "gpt2_xl": (1_557_611_200, {"dense0": 48}, "flash"),
    "phi3_mini": (3_821_079_552, {"dense0": 32}, "flash"),
    # 671,026,419,200 published counts the 58 MoE gates' 256 score-correction biases, buffers in HF
    "deepseek_v3": (671_026_419_200 - 58 * 256, {"dense0": 3, "moe0": 58}, "efficient"),
    "t5_xl": (None, {"dense0": 1, "dense1": 23, "dense2": 1, "dense3": 23}, "efficient"),
    "vit_h14": (None, {"dense0": 32}, "flash"),
}


def _module(name: str):
    sys.path.insert(0, str(REAL))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REAL))


def _meta_count(name: str) -> int:
    """Parameters of the real-depth model built on the meta device (tied weights once)."""
    import torch

    mod = _module(name)
    with torch.device("meta"):
        model = type(mod.build_model())(mod.config())
    return sum(p.numel() for p in model.parameters())


def _trace(traced, name: str, **kw):
    return traced(str(REAL / f"{name}.py"), seq=kw.pop("seq", SEQ), **kw)


@pytest.mark.parametrize("name", sorted(FULL_KINDS))
def test_real_model_traces_with_exact_parameter_count(traced, name):
    published, full_kinds, kernel = FULL_KINDS[name]
    g = _trace(traced, name)
    assert {b.kind for b in g.blocks} == set(full_kinds)
    full = g.param_count + sum(b.graph.param_count * (full_kinds[b.kind] - b.count) for b in g.blocks)
    assert full == _meta_count(name)
    if published is not None:
        assert full == published
    assert all(b.description.startswith(f"{kernel} attention") for b in g.blocks)
    if kernel != "eager":       # eager matmuls view scores differently at batch 1 and 3: 2 guessed views
        assert not any("guessed" in note for note in g.model.notes)


def test_vit_counts_samples_not_tokens(traced):
    g = _trace(traced, "vit_h14")
    assert round(_meta_count("vit_h14") / 1e6) == 632               # ViT-H/14: 632M (Dosovitskiy et al.)
    m = g.model
    assert (m.token_inputs, m.throughput_unit, m.positions) == (False, "samples", 257)
    # seq does not reach an image model: no dim scales with it, the work is the same at any seq
    assert not any("seq" in t.dim_roles for n in g.blocks[0].graph.nodes for t in n.outputs if t)
    assert _trace(traced, "vit_h14", seq=128).flops_per_step_per_sample() == g.flops_per_step_per_sample()


def test_token_models_count_tokens(traced):
    m = _trace(traced, "llama31_8b").model
    assert (m.token_inputs, m.throughput_unit, m.positions) == (True, "tokens", SEQ)


def _attention_kernels(graph):
    return [n for n in graph.ops() if "attention" in n.op]


def test_mistral_at_32k_prices_attention_with_its_4k_window(traced):
    from autoplan.frontend.costs import window_fraction

    s, w, heads, head_dim = 32768, 4096, 32, 128
    g = _trace(traced, "mistral_7b", seq=s)
    assert g.model.sliding_window == w
    kernels = _attention_kernels(g.blocks[0].graph)
    assert [n.op for n in kernels] == ["aten._scaled_dot_product_flash_attention.default",
                                       "aten._scaled_dot_product_flash_attention_backward.default"]
    band = (2 * s * w - w * w) / (s * s)
    assert window_fraction(s, s, w) == pytest.approx(band) and band == pytest.approx(0.234375)
    full_forward = 4 * heads * s * s * head_dim                    # QKᵀ and PV at full s²
    assert [n.flops for n in kernels] == pytest.approx([band * full_forward, band * 2.5 * full_forward])
    assert all(n.attention_window == w for n in kernels)
    assert g.blocks[0].description == "flash attention (window 4,096) + SwiGLU MLP"
    # no s×s mask or score tensor is kept: the window runs inside the kernel
    two_seq = [n for n in g.blocks[0].graph.nodes for t in n.outputs
               if t is not None and t.dim_roles.count("seq") >= 2]
    assert two_seq == []


def test_sliding_window_shorter_than_seq_runs_windowed_flash(traced):
    """Mistral at 8K (window 4K): windowed flash attention, priced at the band."""
    short, long_ = _trace(traced, "mistral_7b", seq=4096), _trace(traced, "mistral_7b", seq=8192)
    f_short = _attention_kernels(short.blocks[0].graph)[0]
    f_long = _attention_kernels(long_.blocks[0].graph)[0]
    assert (f_short.attention_window, f_long.attention_window) == (0, 4096)
    # full attention would be 4x the FLOPs at 2x seq; the 4K band over 8K keys is 3x
    assert f_long.flops / f_short.flops == pytest.approx(3.0)


def _is_core(graph, n) -> bool:
    """The attention core: SDPA kernels and ops reading or writing a tensor with two seq dims."""
    tensors = list(n.outputs) + [graph.tensor(r) for r in n.inputs]
    return "attention" in n.op or any(t is not None and t.dim_roles.count("seq") >= 2 for t in tensors)


def test_deepseek_v3_sdpa_and_eager_differ_only_in_the_attention_kernel(traced):
    sdpa, eager = _trace(traced, "deepseek_v3"), _trace(traced, "deepseek_v3_eager")
    assert sdpa.param_count == eager.param_count
    assert (sdpa.model.head_dim, sdpa.model.v_head_dim, sdpa.model.attention) == (192, 128, "sdpa")
    assert eager.model.attention == "eager"
    for a, b in zip(sdpa.blocks, eager.blocks):
        assert a.kind == b.kind and a.count == b.count
        outside_a = sorted(n.flops for n in a.graph.ops() if not _is_core(a.graph, n) and n.flops)
        outside_b = sorted(n.flops for n in b.graph.ops() if not _is_core(b.graph, n) and n.flops)
        assert outside_a == outside_b
        kernels = _attention_kernels(a.graph)
        assert [n.op for n in kernels] == ["aten._scaled_dot_product_efficient_attention.default",
                                           "aten._scaled_dot_product_efficient_attention_backward.default"]
        # MLA: q/k head 192, v head 128, and the output has the value head size
        fwd = kernels[0]
        q, k, v = (a.graph.tensor(r).shape for r in fwd.inputs[:3])
        assert (q[-1], k[-1], v[-1], fwd.out.shape[-1]) == (192, 192, 128, 128)
        heads = q[1]
        assert fwd.flops == 2 * heads * SEQ * SEQ * (192 + 128)      # QKᵀ at 192, PV at 128
        assert not _attention_kernels(b.graph)                       # eager: explicit matmuls


def test_gemma2_local_and_global_layers_are_two_kinds_with_softcapped_eager_scores(traced):
    g = _trace(traced, "gemma2_9b", seq=SEQ)
    assert g.order == ("dense0", "dense1")
    local, glob = (b.graph for b in g.blocks)
    assert local.param_count == glob.param_count
    assert g.model.sliding_window == 4096 and g.model.attention == "eager"
    for graph in (local, glob):
        # eager attention materialises the scores; soft-capping is a tanh on them
        tanh = [n for n in graph.ops("forward") if n.op == "aten.tanh.default"]
        assert tanh and all(n.out.dim_roles.count("seq") == 2 for n in tanh)
        assert any(n.saved and n.out is not None and n.out.dim_roles.count("seq") == 2 for n in graph.ops())


def test_t5_traces_both_stacks_as_block_kinds(traced):
    g = _trace(traced, "t5_xl")
    assert g.order == ("dense0", "dense1", "dense2", "dense3")
    assert [b.module_paths for b in g.blocks] == [("encoder.block.0",), ("encoder.block.1",),
                                                  ("decoder.block.0",), ("decoder.block.1",)]
    assert g.model.encoder_layers == 2 and g.model.layers == 4
    decoder = g.block("dense3").graph
    cross = [n for n in _attention_kernels(decoder) if "EncDecAttention" in n.module]
    assert cross and all(n.attention_window == 0 for n in cross)
    # post runs what sits between the stacks (encoder final norm, decoder embedding) and hands the
    # decoder its two inputs, whose gradients come back from the decoder blocks
    assert g.post.output_roles[:3] == ("loss", "activation", "activation")
    assert "encoder.final_layer_norm.weight" in {n.param for n in g.post.params()}


def test_phi3_traces_no_empty_tensor(traced):
    """Phi-3's rotary concatenates an empty pass-through slice; the trace drops that operand."""
    g = _trace(traced, "phi3_mini")
    graph = g.blocks[0].graph
    empty = [n for n in graph.ops() if any(graph.tensor(r).numel == 0 for r in n.inputs)]
    assert empty == []
    assert all(0 not in n.out.shape for n in graph.ops() if n.out is not None)
