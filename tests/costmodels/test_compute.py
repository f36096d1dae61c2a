"""costmodels/compute.py: an op's GPU time, and the stack profile that carries the host floor."""
import os

import pytest

from costmodels.compute import PROFILE_DIR, load_profile, op_time

PEAK, HBM = 312e12, 2.039e12


def test_op_time_is_the_gpu_side_and_the_stack_profile_carries_the_host_floor():
    """The host floor is applied per phase (``cost.parts.host_bound``, tests/autoplan/cost/test_host_floor.py),
    so an op's time is its GPU time: roofline plus the profile's per-kernel overhead."""
    prof = load_profile("a100", os.path.join(PROFILE_DIR, "a100-megatron-deepspeed.yaml"))
    assert (prof.host_floor_s, prof.overhead_s) == (pytest.approx(55e-6), pytest.approx(30e-6))
    base = load_profile("a100")
    assert base.host_floor_s == 0.0
    tiny = dict(kind="memory", flops=0.0, nbytes=4096.0, peak_flops=PEAK, hbm_bw=HBM)
    assert op_time(**tiny, profile=base) == pytest.approx(base.overhead_s, rel=1e-3)
    assert op_time(**tiny, profile=prof) == pytest.approx(30e-6, rel=1e-3)
    big = dict(kind="gemm", flops=2.0 * 8192 ** 3, nbytes=3 * 2 * 8192 ** 2, peak_flops=PEAK, hbm_bw=HBM,
               gemm=(8192, 8192, 8192))
    assert op_time(**big, profile=prof) - op_time(**big, profile=base) == pytest.approx(26e-6)
    assert op_time(**big, profile=base) > 1e-3
