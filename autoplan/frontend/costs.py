"""Per-op costs of a traced node: FLOPs, bytes moved, GEMM shape, view-ness.

FLOPs (multiply-add = 2):

* ops in ``torch.utils.flop_counter``'s registry (mm, addmm, bmm, baddbmm,
  flash / efficient attention forward and backward, convolutions) use
  torch's own formula.  Attention is counted at full s², with no discount
  for the causal mask (as Megatron before 2025 and Korthikanti et al.):
  forward = 2 GEMMs (QKᵀ, PV) = 4·b·a·s²·d; backward = 5 GEMMs (the
  recomputed QKᵀ, dP, dV, dQ, dK) = 10·b·a·s²·d, i.e. 2.5× forward, which
  is what a flash kernel executes.  Eager attention (explicit bmm's) has
  no recompute: backward = 2× forward.  Causal sliding-window attention
  (window w < s keys) executes a band of s·w − w²/2 query-key pairs instead
  of the causal triangle's s²/2; on the same full-s² convention its count
  is the full count × ``window_fraction`` = (2·s·w − w²) / s², which is 1
  at w = s (Mistral 7B at s = 32K, w = 4K: 0.234).
* ``_grouped_mm`` (not in the registry): 2·M·N·K summed over groups = 2·(rows of
  the 2-D operand)·N·K.
* data movement (copies, casts, concatenation, indexing, scatter/gather,
  embedding lookups, factories): 0.
* every other op (pointwise, reductions, norms, softmax, losses): the numel
  of its largest tensor operand — one FLOP per element, a rough count that
  only matters for memory-bound ops, whose time comes from bytes.

Bytes: ``bytes_read`` = bytes of tensor inputs, ``bytes_written`` = bytes of
tensor outputs; views and aliases move nothing.
"""
from __future__ import annotations

from math import prod

import torch
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

DATA_MOVEMENT = frozenset({
    "_to_copy", "copy", "copy_", "clone", "contiguous", "cat", "stack", "index", "index_select",
    "gather", "scatter", "scatter_add", "index_add", "index_put", "index_put_", "_index_put_impl_",
    "index_copy", "embedding", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like",
    "empty", "empty_like", "empty_strided", "new_zeros", "new_ones", "new_empty", "new_full",
    "new_empty_strided", "arange", "fill", "fill_", "one_hot", "slice_backward", "select_backward",
    "slice_scatter", "select_scatter", "constant_pad_nd", "repeat", "repeat_interleave",
    "scalar_tensor", "lift_fresh_copy", "_unsafe_index", "masked_scatter", "flip", "roll", "tril",
    "triu", "randint", "rand", "randn", "bernoulli", "_local_scalar_dense", "sort", "topk",
})


def is_view(target) -> bool:
    """True for ATen views/aliases (no data movement); ``_unsafe_view`` included."""
    if target is aten._unsafe_view.default:
        return True
    return bool(getattr(target, "is_view", False))


def op_base_name(target) -> str:
    """``aten.mm.default`` → ``mm``."""
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _numel(t) -> int:
    return prod(t.shape) if isinstance(t, torch.Tensor) else 0


def gemm_shape(target, args) -> tuple[int, int, int] | None:
    """(M, N, K) of a matrix multiply, batch folded into M; None for other ops."""
    packet = getattr(target, "overloadpacket", None)
    if packet is aten.mm:
        (m, k), n = args[0].shape, args[1].shape[1]
        return (m, n, k)
    if packet is aten.addmm:
        (m, k), n = args[1].shape, args[2].shape[1]
        return (m, n, k)
    if packet in (aten.bmm, aten.baddbmm):
        a, b = (args[0], args[1]) if packet is aten.bmm else (args[1], args[2])
        return (a.shape[0] * a.shape[1], b.shape[2], a.shape[2])
    if packet is aten._grouped_mm:
        a, b = args[0], args[1]
        if a.dim() == 2 and b.dim() == 3:        # [M, K] x [G, K, N] with group offsets
            return (a.shape[0], b.shape[2], a.shape[1])
        if a.dim() == 3 and b.dim() == 3:        # [G, M, K] x [G, K, N]
            return (a.shape[0] * a.shape[1], b.shape[2], a.shape[2])
        if a.dim() == 2 and b.dim() == 2:        # [K, M]^T x [K, N] per group (weight grads)
            return (a.shape[0], b.shape[1], a.shape[1])
    return None


def is_attention_kernel(target) -> bool:
    """A fused SDPA kernel, forward or backward (flash, memory-efficient, cuDNN)."""
    return "attention" in op_base_name(target)


def window_fraction(q_len: int, k_len: int, window: int) -> float:
    """Share of full attention a causal kernel with a ``window``-key band computes (see docstring)."""
    if window <= 0 or window >= k_len:
        return 1.0
    return (2.0 * q_len * window - window * window) / (q_len * k_len)


def attention_is_causal(target, args, kwargs) -> bool:
    """Whether an SDPA kernel call masks causally: its ``is_causal`` argument, found by name in
    the op's schema (flash, memory-efficient and cuDNN kernels, forward and backward)."""
    if not is_attention_kernel(target):
        return False
    schema = getattr(target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name == "is_causal":
            return bool(args[i] if i < len(args) else kwargs.get("is_causal", arg.default_value))
    return False


def attention_lengths(target, args) -> tuple[int, int] | None:
    """(query length, key length) of an SDPA kernel call: q and k are [b, h, s, d] (args 0 and 1,
    or 1 and 2 for backward kernels, whose first argument is the output gradient)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 4]
    if len(tensors) < 2 or not is_attention_kernel(target):
        return None
    q, k = (tensors[1], tensors[2]) if "backward" in op_base_name(target) else (tensors[0], tensors[1])
    return int(q.shape[2]), int(k.shape[2])


def node_flops(target, args, kwargs, out) -> float:
    """FLOPs of one ATen call (see module docstring)."""
    if is_view(target):
        return 0.0
    packet = getattr(target, "overloadpacket", None)
    formula = flop_registry.get(packet)
    if formula is not None:
        return float(formula(*args, **kwargs, out_val=out))
    if packet is aten._grouped_mm:
        m, n, k = gemm_shape(target, args)  # type: ignore[misc]  # _grouped_mm has a GEMM shape
        return 2.0 * m * n * k
    if op_base_name(target) in DATA_MOVEMENT:
        return 0.0
    tensors = [x for x in torch.utils._pytree.tree_leaves((args, kwargs, out))
               if isinstance(x, torch.Tensor)]
    return float(max((_numel(t) for t in tensors), default=0))
