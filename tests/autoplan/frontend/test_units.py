"""Small frontend modules: dims, costs, blocks, fakes, gpu_kernels, fx_meta, hf, cache, source, summary."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.errors import UserError
from autoplan.frontend import costs, dims
from autoplan.frontend.blocks import find_layer_stack, structural_signature
from autoplan.frontend.fakes import fakeify_module, new_fake_mode
from autoplan.frontend.gpu_kernels import GpuKernels, aten_op

aten = torch.ops.aten


# --- dims --------------------------------------------------------------------------

def test_dim_roles_are_told_apart_by_scaling():
    sizes, sizes2 = (1, 64), dims.alt_sizes(1, 64)
    assert sizes2 == (3, 32)
    assert dims.dim_role(64, 64, sizes, sizes2) == ""          # hidden == seq: unchanged
    assert dims.dim_role(64, 32, sizes, sizes2) == "seq"
    assert dims.dim_role(1, 3, sizes, sizes2) == "batch"
    assert dims.dim_role(64, 96, sizes, sizes2) == "tokens"    # b·s
    assert dims.dim_role(16, 48, sizes, sizes2) == "batch"     # b·heads
    assert dims.dim_role(33, 49, sizes, sizes2) == "tokens"    # E·C + 1 (capacity buffer)


# --- costs -------------------------------------------------------------------------

def test_costs():
    with FakeTensorMode():
        a, b = torch.empty(8, 4), torch.empty(4, 6)
        out = a @ b
    assert costs.node_flops(aten.mm.default, (a, b), {}, out) == 2 * 8 * 4 * 6
    assert costs.gemm_shape(aten.mm.default, (a, b)) == (8, 6, 4)
    assert costs.is_view(aten.view.default) and costs.is_view(aten._unsafe_view.default)
    assert not costs.is_view(aten.clone.default)
    assert costs.node_flops(aten.view.default, (out, [48]), {}, out.view(48)) == 0
    assert costs.node_flops(aten.gelu.default, (out,), {}, out) == 48
    assert costs.node_flops(aten.cat.default, ([out, out],), {}, out) == 0


def test_window_fraction_is_the_causal_band_over_the_full_square():
    assert costs.window_fraction(8, 8, 0) == costs.window_fraction(8, 8, 8) == costs.window_fraction(8, 8, 9) == 1.0
    # 8 queries, window 2: the band has 2·8 − 2²/2 = 14 pairs, the causal triangle 8²/2 = 32
    assert costs.window_fraction(8, 8, 2) == (2 * 8 * 2 - 4) / 64 == 14 / 32
    assert costs.window_fraction(32768, 32768, 4096) == 0.234375


def test_attention_lengths_of_forward_and_backward_kernels():
    with FakeTensorMode():
        q, k = torch.empty(1, 2, 8, 4), torch.empty(1, 2, 6, 4)
        g = torch.empty(1, 2, 8, 4)
    assert costs.attention_lengths(aten._scaled_dot_product_flash_attention.default, (q, k, k)) == (8, 6)
    assert costs.attention_lengths(aten._scaled_dot_product_flash_attention_backward.default,
                                   (g, q, k, k, g)) == (8, 6)
    assert costs.attention_lengths(aten.mm.default, (q, k)) is None


# --- blocks ------------------------------------------------------------------------

class _Dense(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)


class _Experts(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, d, d))


def test_layer_stack_and_kinds_by_structure():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.layers = nn.ModuleList([_Dense(8), _Experts(8), _Experts(8), _Dense(8)])
            self.small = nn.ModuleList([nn.Linear(8, 8)])
    stack = find_layer_stack(Net())
    assert stack.path == "layers" and stack.kinds == ("dense0", "moe0", "moe0", "dense0")
    assert structural_signature(_Dense(8)) == structural_signature(_Dense(8)) != structural_signature(_Dense(4))
    assert stack.stacks == (("layers", 0),)


def test_layers_with_other_attention_attributes_are_other_kinds():
    local, full = _Dense(8), _Dense(8)
    local.sliding_window, full.sliding_window = 4096, None
    assert structural_signature(local) != structural_signature(full)
    assert find_layer_stack(nn.ModuleList([local, full, local])).kinds == ("dense0", "dense1", "dense0")


def test_encoder_and_decoder_stacks_in_module_order():
    class Stack(nn.Module):
        def __init__(self, layers, d):
            super().__init__()
            self.block = nn.ModuleList([_Dense(d) for _ in range(layers)])

    class EncDec(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = Stack(2, 8), Stack(3, 9)
            self.tiny = nn.ModuleList([nn.Linear(2, 2)])          # < 20 % of the main stack: not a stack
    stack = find_layer_stack(EncDec())
    assert stack.path == "decoder.block"                          # the larger one
    assert stack.stacks == (("encoder.block", 0), ("decoder.block", 2))
    assert stack.paths == ("encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1",
                           "decoder.block.2")
    assert stack.kinds == ("dense0", "dense0", "dense1", "dense1", "dense1")
    assert stack.stack_ranges() == (range(0, 2), range(2, 5))


# --- fakes -------------------------------------------------------------------------

def test_fakeify_keeps_ties_and_allocates_nothing():
    with torch.device("meta"):
        emb = nn.Embedding(100_000, 8192)          # 3 GB if it were real
        head = nn.Linear(8192, 100_000, bias=False)
        head.weight = emb.weight
        model = nn.ModuleDict({"emb": emb, "head": head})
    mode = new_fake_mode()
    fakeify_module(model, mode, torch.bfloat16)
    assert isinstance(model["emb"].weight, FakeTensor) and model["emb"].weight.dtype == torch.bfloat16
    assert model["emb"].weight is model["head"].weight


# --- gpu_kernels ---------------------------------------------------------------------

_MODE = new_fake_mode()


def _ops(fn, *args) -> set[str]:
    with _MODE, GpuKernels():
        gm = make_fx(fn)(*args)
    return {str(aten_op(n.target)) for n in gm.graph.nodes if n.op == "call_function"}


def test_gpu_kernels_redirects():
    F = torch.nn.functional
    with _MODE:
        q, k = torch.empty(1, 4, 16, 8), torch.empty(1, 2, 16, 8)
        x, w = torch.empty(2, 8), torch.empty(8)
        mask = torch.ones(16, 16, dtype=torch.bool).tril()
    assert "aten._scaled_dot_product_flash_attention.default" in _ops(
        lambda q, k: F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True), q, k)
    assert "aten._scaled_dot_product_efficient_attention.default" in _ops(
        lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), q, mask)
    assert "aten.native_dropout.default" in _ops(lambda x: F.dropout(x, 0.1, True), x)
    rms = _ops(lambda x, w: F.rms_norm(x, (8,), w), x, w)
    assert "aten._fused_rms_norm.default" in rms and "aten.pow.Tensor_Scalar" not in rms


def test_mla_attention_takes_the_value_head_size():
    """q/k head 12, v head 8 (MLA): the memory-efficient kernel, whose output has the value head size."""
    F = torch.nn.functional
    with _MODE:
        q, v = torch.empty(1, 4, 16, 12), torch.empty(1, 4, 16, 8)
    with _MODE, GpuKernels():
        out = F.scaled_dot_product_attention(q, q, v, is_causal=True)
    assert tuple(out.shape) == (1, 4, 16, 8)
    ops = _ops(lambda q, v: F.scaled_dot_product_attention(q, q, v, is_causal=True), q, v)
    assert "aten._scaled_dot_product_efficient_attention.default" in ops


def test_concatenation_drops_empty_operands():
    with _MODE:
        x, empty = torch.empty(2, 8), torch.empty(2, 0)
    ops = []
    with _MODE, GpuKernels():
        gm = make_fx(lambda x, e: torch.cat([x * 2, e], dim=-1))(x, empty)
        ops = [n for n in gm.graph.nodes if n.target is aten.cat.default]
    assert len(ops) == 1 and len(ops[0].args[0]) == 1
    with _MODE, GpuKernels():
        assert tuple(torch.cat([empty, empty], dim=-1).shape) == (2, 0)


def test_fused_rms_norm_matches_rms_norm_numerically():
    x, w = torch.randn(3, 8), torch.randn(8)
    ours = torch.ops.autoplan.fused_rms_norm(x, [8], w, 1e-6)[0]
    torch.testing.assert_close(ours, torch.nn.functional.rms_norm(x, (8,), w, 1e-6))


# --- fx_meta -------------------------------------------------------------------------

def test_module_paths_on_forward_and_backward_nodes():
    from autoplan.frontend.fx_meta import (
        module_paths,
        node_module,
        node_seq_nr,
        preserve_node_meta,
        tag_backward_with_forward_seq_nr,
    )
    mode = new_fake_mode()
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    fakeify_module(model, mode, torch.float32)
    with mode:
        x = torch.empty(2, 4, requires_grad=True)

    def fn(x):
        y = model(x)
        tag_backward_with_forward_seq_nr([y])
        return torch.autograd.grad([y.sum()], [x])

    with preserve_node_meta(), module_paths(model):
        gm = make_fx(fn)(x)
    fwd = {n.name: node_module(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert fwd["addmm"] == "0" and fwd["relu"] == "1"
    assert all(node_seq_nr(n) is not None for n in gm.graph.nodes if n.name.startswith("threshold_backward"))


# --- hf ------------------------------------------------------------------------------

def test_unpacked_sequences_patch_is_scoped():
    mu = pytest.importorskip("transformers.masking_utils")

    from autoplan.frontend.hf import unpacked_sequences
    original = mu.find_packed_sequence_indices
    with unpacked_sequences():
        assert mu.find_packed_sequence_indices(torch.tensor([[0, 1, 0, 1]])) is None
    assert mu.find_packed_sequence_indices is original


def test_windowed_sdpa_drops_the_band_mask_and_tags_the_window():
    from autoplan.frontend.hf import windowed_sdpa
    seen = []

    def sdpa(module, q, k, v, mask, *args, **kwargs):
        seen.append((mask, kwargs.get("sliding_window")))
    causal, bidirectional = nn.Module(), nn.Module()
    causal.is_causal, bidirectional.is_causal = True, False
    q = torch.empty(1, 2, 8, 4)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    forward = windowed_sdpa(sdpa)
    forward(causal, q, q, q, mask, sliding_window=4)
    forward(bidirectional, q, q, q, mask, sliding_window=4)
    forward(causal, q, q, q, mask, sliding_window=None)
    assert seen == [(None, None), (mask, 4), (mask, None)]


def test_sliding_window_patch_is_scoped():
    mu = pytest.importorskip("transformers.modeling_utils")

    from autoplan.frontend.hf import sliding_window_kernels
    original = mu.AttentionInterface._global_mapping["sdpa"]
    with sliding_window_kernels():
        assert mu.AttentionInterface._global_mapping["sdpa"] is not original
    assert mu.AttentionInterface._global_mapping["sdpa"] is original


# --- cache ---------------------------------------------------------------------------

def test_cache_key_and_location(tmp_path, monkeypatch):
    from autoplan.frontend import cache
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    assert cache.cache_dir() == tmp_path
    assert cache.cache_key("m", 2048, 1, "bf16") != cache.cache_key("m", 4096, 1, "bf16")
    assert cache.load("nothing") is None
    monkeypatch.setenv("AUTOPLAN_NO_CACHE", "1")
    assert cache.cache_dir() is None


# --- source --------------------------------------------------------------------------

def test_sources():
    from autoplan.frontend.source import load_source
    zoo = load_source("llama3-8b")
    assert zoo.kind == "zoo" and zoo.info.layers == 32
    spec = load_source("moe:layers=2,hidden=64,heads=4,vocab=100,experts=4")
    assert spec.kind == "spec" and spec.with_experts is not None
    assert zoo.fingerprint != load_source("llama3-70b").fingerprint
    with pytest.raises(UserError, match="unknown model family 'bert'"):
        load_source("bert:layers=2")
