"""costmodels/precision.py and the FP8 kinds of costmodels/compute.py: hand-computed bytes and times."""
import dataclasses

import pytest

from costmodels.compute import load_profile, op_time
from costmodels.precision import (
    cast_bytes,
    gather_bytes_per_param,
    gemm_cast_bytes,
    is_low_precision,
    weight_cast_bytes,
)
from topologies.gpus import gpu_spec

H100 = gpu_spec("h100")


def test_cast_bytes_per_recipe():
    """A 4096 x 1024 bf16 tensor cast to both orientations: 2 bytes read, 1 + 1 written per
    element; the dynamic tensorwise recipe reads it again for its amax; rowwise adds an fp32 scale
    per row and per column, MXFP8 a byte per 32 elements per orientation."""
    n = 4096 * 1024
    assert cast_bytes("fp8-delayed", 4096, 1024) == 4 * n
    assert cast_bytes("fp8", 4096, 1024) == 6 * n
    assert cast_bytes("fp8-rowwise", 4096, 1024) == 4 * n + 4 * (4096 + 1024)
    assert cast_bytes("mxfp8", 4096, 1024) == 4 * n + 2 * n / 32
    # a forward or input-gradient GEMM casts its activation input (M x K); a weight gradient nothing
    assert gemm_cast_bytes("fp8", 8, 32, tokens_out=True) == 6 * 8 * 32
    assert gemm_cast_bytes("fp8", 8, 32, tokens_out=False) == 0.0
    assert weight_cast_bytes("fp8-delayed", 1e6) == 4e6 and weight_cast_bytes("bf16", 1e6) == 0.0
    assert [is_low_precision(p) for p in ("bf16", "fp8", "mxfp8")] == [False, True, True]


def test_fsdp_gathers_fp8_weights_only_under_dynamic_tensorwise_at_zero3():
    assert gather_bytes_per_param("fp8", 3) == 1.0
    assert gather_bytes_per_param("fp8", 1) == gather_bytes_per_param("fp8-rowwise", 3) == 2.0
    assert gather_bytes_per_param("bf16", 3) == 2.0


def test_one_fp8_gemm_on_h100_against_bf16_from_the_peaks():
    """8192³ GEMM on H100, shape factor (8192/8320)³ = 0.95455: BF16 at 0.7 of 989 TFLOP/s takes
    2·8192³ / (989e12 · 0.66818) = 1.6638 ms; FP8 at the profile's 0.6 of 1979 TFLOP/s
    2·8192³ / (1979e12 · 0.57273) = 0.9701 ms; + 4 µs overhead each: 1.71x faster, not 2x."""
    prof = load_profile("h100")
    assert (prof.gemm_peak_fraction, prof.fp8_gemm_peak_fraction) == (0.7, 0.6)
    flops, gemm = 2.0 * 8192 ** 3, (8192.0, 8192.0, 8192.0)
    shape = (8192 / 8320) ** 3
    bf16 = op_time("gemm", flops, 0.0, peak_flops=H100.bf16_flops, hbm_bw=H100.hbm_bw, profile=prof, gemm=gemm)
    fp8 = op_time("gemm_fp8", flops, 0.0, peak_flops=H100.fp8_flops, hbm_bw=H100.hbm_bw, profile=prof, gemm=gemm)
    assert bf16 == pytest.approx(flops / (989e12 * 0.7 * shape) + 4e-6)
    assert fp8 == pytest.approx(flops / (1979e12 * 0.6 * shape) + 4e-6)
    assert bf16 == pytest.approx(1.6678e-3, rel=1e-4) and fp8 == pytest.approx(0.9741e-3, rel=1e-4)
    # a profile without an FP8 fraction runs FP8 on the BF16 curve: twice the rate
    same = dataclasses.replace(prof, fp8_gemm_peak_fraction=0.0)
    assert op_time("gemm_fp8", flops, 0.0, peak_flops=H100.fp8_flops, hbm_bw=H100.hbm_bw, profile=same,
                   gemm=gemm) == pytest.approx(flops / (1979e12 * 0.7 * shape) + 4e-6)
    # the cast of its activation input (fp8-delayed): 4 bytes per element of A at 0.85 · 3.35 TB/s,
    # 0.0943 ms + 4 µs: a ninth of what FP8 saves on this GEMM
    cast = op_time("cast", 0.0, gemm_cast_bytes("fp8-delayed", 8192, 8192, True), peak_flops=H100.bf16_flops,
                   hbm_bw=H100.hbm_bw, profile=prof)
    assert cast == pytest.approx(4 * 8192 ** 2 / (0.85 * 3.35e12) + 4e-6)
    assert cast == pytest.approx(0.0983e-3, rel=1e-3)


def test_weight_copies_by_engine_zero_and_parameter_dtype():
    from costmodels.precision import weight_copy_bytes

    assert weight_copy_bytes("fp8", "transformer-engine", 1, False) == 2.0       # FP8 weight + transpose, cached
    assert weight_copy_bytes("fp8", "transformer-engine", 1, True) == 0.0        # they replace the bf16 weight
    assert weight_copy_bytes("fp8", "transformer-engine", 3, False) == 1.0       # the transpose saved per layer
    assert weight_copy_bytes("mxfp8", "transformer-engine", 0, False) == 2 * (1 + 1 / 32)
    assert weight_copy_bytes("fp8", "torchao", 1, False) == 0.0
    assert weight_copy_bytes("bf16", "transformer-engine", 1, False) == 0.0
