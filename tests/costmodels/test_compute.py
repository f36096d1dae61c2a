"""costmodels/compute.py: the per-op host floor and the stack profile that carries it."""
import os

import pytest

from costmodels.compute import PROFILE_DIR, load_profile, op_time

PEAK, HBM = 312e12, 2.039e12


def test_host_floor_bounds_short_ops_only():
    prof = load_profile("a100", os.path.join(PROFILE_DIR, "a100-megatron-deepspeed.yaml"))
    assert prof.host_floor_s == pytest.approx(55e-6)
    base = load_profile("a100")
    assert base.host_floor_s == 0.0
    tiny = dict(kind="memory", flops=0.0, nbytes=4096.0, peak_flops=PEAK, hbm_bw=HBM)
    assert op_time(**tiny, profile=base) == pytest.approx(base.overhead_s, rel=1e-3)
    assert op_time(**tiny, profile=prof) == pytest.approx(55e-6)
    big = dict(kind="gemm", flops=2.0 * 8192 ** 3, nbytes=3 * 2 * 8192 ** 2, peak_flops=PEAK, hbm_bw=HBM,
               gemm=(8192, 8192, 8192))
    assert op_time(**big, profile=prof) == op_time(**big, profile=base) > 1e-3
