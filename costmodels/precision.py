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
``enable_fsdp_float8_all_gather``), and Megatron's distributed optimizer under
``--fp8-param-gather`` (the parameters themselves FP8): ``gather_bytes_per_param``.

Memory: what the FP8 engine (``FP8_ENGINES``) keeps beyond the bf16 plan's states and saved
activations, per element:

=====================  ==========================================  ===========================
engine                 a linear layer's saved input                its weight
=====================  ==========================================  ===========================
transformer-engine     the FP8 cast (``saved_input_bytes``: 1,     zero 0/1: an FP8 copy and its
(Megatron-LM/-Core,    +1/32 under MXFP8), the columnwise copy      transpose cached across the
NeMo, Megatron-Bridge, the weight-gradient GEMM reads, in place     step (``is_first_microbatch``),
Composer ``amp_fp8``)  of the bf16 input when only GEMMs read it    2 B; with FP8 parameters
                       in backward; beside it where another op      (``--fp8-param-gather``) the
                       keeps the bf16 input too (flash attention's  FP8 parameter and its
                       output, the o-projection's input)            transpose replace the bf16
                                                                    one: 0; zero 2/3 (no cache:
                                                                    FSDP regathers) the FP8
                                                                    transpose saved for backward,
                                                                    1 B (``weight_copy_bytes``)
torchao (torchtitan)   the bf16 input (it casts again in backward)  none (casts per use)
=====================  ==========================================  ===========================

Transformer Engine's delayed scaling keeps an fp32 amax history of ``AMAX_HISTORY_LEN`` entries
for each of ``AMAX_TENSORS_PER_GEMM`` tensors of every FP8 GEMM (``amax_history_bytes``).
"""
from __future__ import annotations

BF16_BYTES = 2.0
FP8_BYTES = 1.0
LOW_PRECISION = ("fp8", "fp8-rowwise", "fp8-delayed", "mxfp8")
FP8_ENGINES = ("transformer-engine", "torchao")   # what runs a plan's FP8 GEMMs (module docstring)
AMAX_HISTORY_LEN = 1024            # TE ``DelayedScaling.amax_history_len`` default (Megatron-Bridge, NeMo)
AMAX_TENSORS_PER_GEMM = 5          # TE fp8_meta: forward input, weight, output; backward dY, dX
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


def gather_bytes_per_param(precision: str, zero: int, fp8_params: bool = False) -> float:
    """Bytes per parameter the data-parallel group all-gathers: FP8 under dynamic tensorwise
    scaling at ZeRO-3 (torchao's ``enable_fsdp_float8_all_gather``, the only recipe it gathers
    in FP8), and at ZeRO-1 where the parameters are FP8 (Megatron's ``--fp8-param-gather``, any
    FP8 recipe; MXFP8 with its scales); bf16 otherwise.  Priced over a rank's whole parameter
    count: the embedding, head and norms that stay bf16 are a few per cent of a large model's."""
    if zero == 3 and precision == "fp8":
        return FP8_BYTES
    if zero == 1 and fp8_params and is_low_precision(precision):
        return fp8_elem_bytes(precision)
    return BF16_BYTES


def fp8_elem_bytes(precision: str) -> float:
    """Bytes of one element of one FP8 orientation with its scales (MXFP8: an E8M0 byte per 32)."""
    return FP8_BYTES + (1.0 / MX_BLOCK if precision == "mxfp8" else 0.0)


def saved_input_bytes(precision: str, engine: str) -> float | None:
    """Bytes per element a linear layer keeps of its activation input for the weight gradient:
    Transformer Engine keeps the FP8 cast (module docstring); None where the engine keeps the
    traced bf16 input (torchao, and every bf16 plan)."""
    if not is_low_precision(precision) or engine != "transformer-engine":
        return None
    return fp8_elem_bytes(precision)


def weight_copy_bytes(precision: str, engine: str, zero: int, fp8_params: bool) -> float:
    """Bytes per linear-layer weight element the FP8 engine keeps beyond the model states'
    bf16 weight (module docstring): Transformer Engine's cached FP8 weight and transpose (zero
    0/1), nothing more with FP8 parameters but the MXFP8 scales, the FP8 transpose saved for
    backward per layer under FSDP (zero 2/3); none under torchao or bf16."""
    if not is_low_precision(precision) or engine != "transformer-engine":
        return 0.0
    both = 2 * fp8_elem_bytes(precision)
    if zero >= 2:
        return fp8_elem_bytes(precision)
    return both - 2 * FP8_BYTES if fp8_params else both


def amax_history_bytes(precision: str, engine: str) -> float:
    """Bytes of Transformer Engine's delayed-scaling state per FP8 GEMM: fp32 amax histories of
    ``AMAX_TENSORS_PER_GEMM`` tensors, ``AMAX_HISTORY_LEN`` long; 0 for every other recipe."""
    if precision != "fp8-delayed" or engine != "transformer-engine":
        return 0.0
    return 4.0 * AMAX_HISTORY_LEN * AMAX_TENSORS_PER_GEMM
