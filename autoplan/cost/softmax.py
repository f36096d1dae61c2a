"""Megatron's fused scale-mask-softmax and its fallback: what eager attention's softmax costs on a
stack that runs Megatron's ``FusedScaleMaskSoftmax`` (profile ``softmax_kernel: megatron``).

Megatron(-DeepSpeed) computes the s×s attention probabilities with one fused CUDA kernel
(``scaled_upper_triang_masked_softmax`` for a causal mask) only where that kernel exists for the
shape (``FusedScaleMaskSoftmax.is_kernel_available``, fp16/bf16 input)::

    16 < sk <= 4096,  sq % 4 == 0,  sk % 4 == 0,  attn_batches % 4 == 0,
    attn_batches % batch_per_block == 0                       (causal mask)

with ``attn_batches = b · np`` (micro-batch × attention heads per tp rank) and
``batch_per_block = (128 / warp) · (2 if 2^⌈log2 sk⌉ <= 128 else 1)``, ``warp = min(32, 2^⌈log2 sk⌉)``
(``get_batch_per_block`` of the kernel).  Elsewhere (e.g. tp = 8 with 16 heads at micro-batch 1:
attn_batches = 2) it falls back to ``forward_torch_softmax``: the fp16 scores are cast to fp32,
scaled, masked, soft-maxed in fp32 and cast back — five kernels where the traced graph (which
stands for the fused path: mask + softmax) has two.  Per direction (forward; backward, its
autograd mirror) the fallback adds

    FALLBACK_KERNELS = 3 launches                              (cast, scale, cast back)
    FALLBACK_BYTES = 28 bytes per score element of HBM traffic
        cast fp16 -> fp32 (2 + 4) + scale (4 + 4) + cast back (4 + 2) + mask and softmax in fp32
        instead of fp16 (+4 each)

of GPU time ``elements · 28 / (hbm_bw · memory_fraction) + 3 · overhead_s``, and the three
launches count against the host's floor (``parts.host_bound``).  Source: Megatron-LM /
Megatron-DeepSpeed ``megatron/model/fused_softmax.py`` (2022-2023).
"""
from __future__ import annotations

import dataclasses
import math

from autoplan.ir import OpGraph, OpNode
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding
from autoplan.sharding.price import recomputed
from costmodels.compute import ComputeProfile

FALLBACK_KERNELS = 3
FALLBACK_BYTES = 28.0
MEGATRON = "megatron"


def fused_kernel_available(attn_batches: int, sq: int, sk: int) -> bool:
    """Megatron's ``is_kernel_available`` for a causal mask (see the module docstring)."""
    if not (16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0):
        return False
    pow2 = 1 << math.ceil(math.log2(sk))
    warp = min(32, pow2)
    batch_per_block = (128 // warp) * (2 if pow2 <= 128 else 1)
    return attn_batches % batch_per_block == 0


def _softmax_nodes(graph: OpGraph) -> list[OpNode]:
    """The forward softmax ops over a (batch, heads, sq, sk) score tensor."""
    return [n for n in graph.ops("forward") if n.op.startswith("aten._softmax") and n.out is not None
            and len(n.out.shape) == 4]


def with_fallback(bs: BlockSharding, graph: OpGraph, plan: Plan, recompute: str, profile: ComputeProfile,
                  hbm_bw: float) -> BlockSharding:
    """``bs`` with the fallback's GPU seconds and launches added where Megatron's fused kernel is
    unavailable for the plan's local shape; ``bs`` itself on any other stack or shape."""
    if profile.softmax_kernel != MEGATRON:
        return bs
    fwd_s = bwd_s = 0.0
    fwd_n = bwd_n = 0
    for n in _softmax_nodes(graph):
        b, heads, sq, sk = n.out.shape  # type: ignore[union-attr]  # a softmax has its output
        local_heads = heads // plan.tp if bs.placements.get(n.name, "R").startswith("S(") else heads
        attn_batches = b * plan.mbs * local_heads
        sq_local = sq // plan.cp
        if fused_kernel_available(attn_batches, sq_local, sk):
            continue
        one = attn_batches * sq_local * sk * FALLBACK_BYTES / (hbm_bw * profile.memory_fraction) \
            + FALLBACK_KERNELS * profile.overhead_s
        runs = 2 if recomputed(graph, n, recompute) else 1       # recomputation reruns the forward
        fwd_s, fwd_n = fwd_s + one, fwd_n + FALLBACK_KERNELS
        bwd_s, bwd_n = bwd_s + one * runs, bwd_n + FALLBACK_KERNELS * runs
    if not fwd_n:
        return bs
    return dataclasses.replace(bs, forward_s=bs.forward_s + fwd_s, backward_s=bs.backward_s + bwd_s,
                               recompute_s=bs.recompute_s + (bwd_s - fwd_s),
                               forward_launches=bs.forward_launches + fwd_n,

                               backward_launches=bs.backward_launches + bwd_n)
