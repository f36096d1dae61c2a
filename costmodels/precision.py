"""Low-precision GEMM recipes: which peak a linear layer's GEMM runs at, and what its scaling
kernels move through HBM.

A plan's ``precision`` (``autoplan.plan.PRECISIONS``) is the precision of the linear layers'
GEMMs — forward, input gradient and weight gradient, as Transformer Engine and torchao run
them — on the GPU's FP8 tensor cores (``GPUSpec.fp8_flops``); attention (flash), norms,
softmax, the LM head and the embedding stay bf16 (``autoplan.sharding.price``).

Casts (memory-bound kernels, ``costmodels.compute.op_time`` kind ``cast``), as Transformer
Engine runs them: each GEMM input is cast once, to both orientations (the row-major copy for
its forward or input-gradient GEMM, the transposed one the weight-gradient GEMM reads, Hopper's
FP8 GEMMs taking only the TN layout): the activation X before the forward GEMM, the output
gradient dY before the input-gradient GEMM (``gemm_cast_bytes``); the weight-gradient GEMM
reads both transposes and casts nothing.  The weights are cast once per step, after the
optimizer updates them (TE keeps their FP8 copies across the step's micro-batches:
``weight_cast_bytes``).  Per element of a cast tensor, 2 bytes read and 1 written per
orientation, plus, by recipe:

==============  ===================================================  ==========================
recipe          scale                                                extra HBM bytes
==============  ===================================================  ==========================
fp8-delayed     one per tensor, from the amax history (TE's          none: the cast kernel
                ``DelayedScaling``)                                   records the amax
fp8             one per tensor, from this tensor's amax (dynamic /    2 per element: the amax
                current scaling: torchao tensorwise, TE               reduction reads the bf16
                ``Float8CurrentScaling``)                              tensor once more
fp8-rowwise     one fp32 scale per row of each orientation            4 per row and column
mxfp8           one E8M0 scale per 32 elements, each orientation      2 per 32 elements
==============  ===================================================  ==========================

FSDP2 gathers FP8 weights under dynamic tensorwise scaling (torchao's
``enable_fsdp_float8_all_gather``): ``gather_bytes_per_param``.
"""
from __future__ import annotations

BF16_BYTES = 2.0
FP8_BYTES = 1.0
LOW_PRECISION = ("fp8", "fp8-rowwise", "fp8-delayed", "mxfp8")
_AMAX_PASS = {"fp8": BF16_BYTES}                  # bytes per element read again for the amax
_ROW_SCALE_BYTES = {"fp8-rowwise": 4.0}           # an fp32 scale per row
MX_BLOCK = 32                                     # elements per MXFP8 scale (E8M0, 1 byte)


def is_low_precision(precision: str) -> bool:
    """The GEMMs of the linear layers run on the FP8 tensor cores."""
    return precision in LOW_PRECISION


def cast_bytes(precision: str, rows: float, cols: float) -> float:
    """HBM bytes of casting one bf16 tensor of ``rows`` × ``cols`` to FP8 in both orientations
    under ``precision`` (module docstring's table)."""
    numel = rows * cols
    out = numel * (BF16_BYTES + 2 * FP8_BYTES + _AMAX_PASS.get(precision, 0.0))
    out += (rows + cols) * _ROW_SCALE_BYTES.get(precision, 0.0)
    if precision == "mxfp8":
        out += 2 * numel / MX_BLOCK
    return out


def gemm_cast_bytes(precision: str, m: float, k: float, tokens_out: bool) -> float:
    """HBM bytes the casts before one FP8 GEMM move: its activation input A (M × K) when the
    GEMM's output has a token dim (forward: X; input gradient: dY), nothing for the weight
    gradient (``tokens_out`` False: its inputs are the transposes cast before)."""
    return cast_bytes(precision, m, k) if tokens_out else 0.0


def weight_cast_bytes(precision: str, numel: float) -> float:
    """HBM bytes of casting ``numel`` weights to FP8 once per step, both orientations (a weight
    matrix's per-row scales are a rounding error beside it and left out); 0 under bf16."""
    if not is_low_precision(precision):
        return 0.0
    return numel * (BF16_BYTES + 2 * FP8_BYTES + _AMAX_PASS.get(precision, 0.0)) + (
        2 * numel / MX_BLOCK if precision == "mxfp8" else 0.0)


def gather_bytes_per_param(precision: str, zero: int) -> float:
    """Bytes per parameter FSDP2 all-gathers: FP8 under dynamic tensorwise scaling at ZeRO-3
    (torchao's ``enable_fsdp_float8_all_gather``, the only recipe it gathers in FP8), bf16
    otherwise."""
    return FP8_BYTES if zero == 3 and precision == "fp8" else BF16_BYTES
