"""The measurement plan of ``autoplan calibrate``: which GEMMs, attention kernels and copies to time.

Shapes follow what the cost model prices for 7B-405B transformers:

* GEMMs ``[M, K] @ [K, N]``: M = tokens per micro-batch in {1k, 2k, 4k, 8k, 16k}; N and K over
  hidden sizes 1k-16k (including 6144 and 12288) split by tp in {1, 2, 4, 8}, which also gives
  the skinny 128-768 dims of a sharded head block or a small expert.  The efficiency curve is
  symmetric in (M, N, K), so weight-gradient GEMMs (K = tokens) are covered too.
* Attention: head_dim 128 (Llama 2/3 7B-405B, GPT-3 175B) with 8, 16 or 32 heads per GPU
  (e.g. 128 heads / tp 8 = 16), seq 2k-32k, batch so that a micro-batch holds >= 16k tokens;
  forward and backward, causal and full mask.
* Copies of 16 MiB - 2 GiB (HBM streaming bandwidth) and three tiny kernels (launch overhead).

The plan is pure data, in a fixed order: the same call returns the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass

TOKENS = (1024, 2048, 4096, 8192, 16384)
HIDDEN_SIZES = (1024, 2048, 4096, 6144, 8192, 12288, 16384)
TP_DEGREES = (1, 2, 4, 8)
SKINNY_DIMS = (128,)
HEAD_DIM = 128
HEADS_PER_GPU = (8, 16, 32)
SEQ_LENGTHS = (2048, 4096, 8192, 16384, 32768)
TOKENS_PER_ATTENTION = 16384
COPY_BYTES = tuple(mib * 2**20 for mib in (16, 64, 256, 1024, 2048))
TINY_KERNELS = ("add_1k", "copy_4k", "gemm_64")

QUICK_TOKENS = (2048, 8192)
QUICK_DIMS = (128, 512, 2048, 8192, 16384)
QUICK_HEADS = (16,)
QUICK_SEQ_LENGTHS = (2048, 8192)
QUICK_COPY_BYTES = (64 * 2**20, 1024 * 2**20)


@dataclass(frozen=True)
class GemmShape:
    """``[m, k] @ [k, n]``."""

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class AttentionShape:
    """SDPA on q, k, v of shape ``[batch, heads, seq, head_dim]``."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool


@dataclass(frozen=True)
class MeasurementPlan:
    """Everything to time, in order.  Attention shapes are timed forward and backward."""

    gemms: tuple[GemmShape, ...]
    attention: tuple[AttentionShape, ...]
    copy_bytes: tuple[int, ...]
    tiny_kernels: tuple[str, ...]


def gemm_dims() -> tuple[int, ...]:
    """N and K values of the full plan: ``{hidden / tp} ∪ SKINNY_DIMS``, sorted."""
    return tuple(sorted({h // tp for h in HIDDEN_SIZES for tp in TP_DEGREES} | set(SKINNY_DIMS)))


def measurement_plan(quick: bool = False) -> MeasurementPlan:
    """The full plan (845 GEMMs, 30 attention shapes), or with ``quick`` a subset (50 and 2)."""
    tokens: tuple[int, ...]
    dims: tuple[int, ...]
    heads: tuple[int, ...]
    seqs: tuple[int, ...]
    masks: tuple[bool, ...]
    copies: tuple[int, ...]
    if quick:
        tokens, dims = QUICK_TOKENS, QUICK_DIMS
        heads, seqs, masks, copies = QUICK_HEADS, QUICK_SEQ_LENGTHS, (True,), QUICK_COPY_BYTES
    else:
        tokens, dims = TOKENS, gemm_dims()
        heads, seqs, masks, copies = HEADS_PER_GPU, SEQ_LENGTHS, (True, False), COPY_BYTES
    gemms = tuple(GemmShape(m, n, k) for m in tokens for n in dims for k in dims)
    attention = tuple(AttentionShape(max(1, TOKENS_PER_ATTENTION // s), a, s, HEAD_DIM, causal)
                      for causal in masks for a in heads for s in seqs)
    return MeasurementPlan(gemms=gemms, attention=attention, copy_bytes=copies,
                           tiny_kernels=TINY_KERNELS)
