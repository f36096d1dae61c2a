"""Flash-attention kernels a training stack runs, priced at their published throughput.

A compute profile's ``attention_fwd_fraction`` / ``attention_bwd_fraction`` are fitted (H100:
to the public rows of ``fit_h100_profile.py``, whose attention is a small share of the step) and
stand for whatever kernel those runs used.  Where a run's own software names its kernel, the
kernel's published throughput prices its attention instead (``EstimateOptions.attention_kernel``;
``profile``, the default, keeps the fitted fractions):

=========  ===================  =====================  =========================================
kernel     forward (causal)     backward               what runs it
=========  ===================  =====================  =========================================
``fa2``    335 TFLOP/s          322 TFLOP/s            FlashAttention-2 (``flash-attn`` 2.x):
                                                       PyTorch SDPA's flash backend, Transformer
                                                       Engine's ``FlashAttention`` backend and its
                                                       early context-parallel path
``cudnn``  539 TFLOP/s          516 TFLOP/s            cuDNN's fused attention (Transformer
                                                       Engine ``FusedAttention``, sub-backend
                                                       ``F16_arbitrary_seqlen``), which TE prefers
                                                       over FlashAttention on sm90 when both apply
``fa3``    616 TFLOP/s          561 TFLOP/s            FlashAttention-3 (``flash-attn`` hopper)
=========  ===================  =====================  =========================================

Source: Shah et al., "FlashAttention-3", arXiv 2407.08608, Figures 5 and 6, H100 80GB SXM5,
BF16, head dim 128, sequence 16K (the longest, where each curve has flattened: at 8K every value
is within 3 %): the causal forward (Figure 5, its FLOPs counted as half the full s², the
convention of ``autoplan.opkinds.attention_work_fraction``) and the backward (Figure 6, without a
causal mask: the paper plots no causal backward).  Transformer Engine's preference for cuDNN on Hopper:
``get_attention_backend`` in ``transformer_engine/pytorch/attention.py`` ("Disabling
FlashAttention to give FusedAttention preference on Hopper+ for performance reasons").

Each throughput becomes a fraction of the dense BF16 peak of the GPU it was measured on (H100
SXM5: 989 TFLOP/s), applied to the pricing GPU's own peak (``GPUSpec.bf16_flops``): a
power-capped H100 runs the kernel at its capped peak's share, as it runs its GEMMs.  GPUs of the
H100's SM (H800, H200) share its numbers; other kinds have none published here.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, get_args

from costmodels.compute import ComputeProfile

AttentionKernel = Literal["profile", "fa2", "cudnn", "fa3"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = get_args(AttentionKernel)
H100_SXM_BF16_PEAK = 989.0e12        # dense BF16 FLOP/s of the GPU the FA3 paper measured on
SAME_SM = {"h800": "h100", "h200": "h100"}   # GPU kinds that run the H100's kernels at its rates


class Throughput(NamedTuple):
    """A kernel's published forward and backward FLOP/s on one GPU, and that GPU's dense BF16 peak."""

    forward: float
    backward: float
    peak: float


PUBLISHED: dict[tuple[str, str], Throughput] = {      # (kernel, GPU kind) -> Throughput (module docstring)
    ("fa2", "h100"): Throughput(335.0e12, 322.0e12, H100_SXM_BF16_PEAK),
    ("cudnn", "h100"): Throughput(539.0e12, 516.0e12, H100_SXM_BF16_PEAK),
    ("fa3", "h100"): Throughput(616.0e12, 561.0e12, H100_SXM_BF16_PEAK),
}


def kernel_fractions(kernel: str, gpu: str) -> tuple[float, float] | None:
    """(forward, backward) fraction of the dense BF16 peak ``kernel`` reaches on GPU kind ``gpu``;
    None for ``profile`` (the profile's fitted fractions).  ValueError where nothing is published
    for that kernel on that GPU."""
    if kernel == "profile":
        return None
    base = SAME_SM.get(gpu.lower(), gpu.lower())
    t = PUBLISHED.get((kernel, base))
    if t is None:
        known = sorted({g for k, g in PUBLISHED if k == kernel})
        raise ValueError(f"no published throughput of attention kernel {kernel!r} on {gpu!r} "
                         f"(known: {', '.join(known) or 'none'})")
    return t.forward / t.peak, t.backward / t.peak


def with_kernel(profile: ComputeProfile, kernel: str, gpu: str) -> ComputeProfile:
    """``profile`` with its attention fractions replaced by ``kernel``'s on ``gpu`` (unchanged
    under ``profile``)."""
    fractions = kernel_fractions(kernel, gpu)
    if fractions is None:
        return profile
    return dataclasses.replace(profile, attention_fwd_fraction=fractions[0], attention_bwd_fraction=fractions[1])
