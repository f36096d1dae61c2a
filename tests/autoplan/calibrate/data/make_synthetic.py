"""Write the SYNTHETIC calibration sample the tests fit: no GPU was run to make it.

Every time is what the cost model itself predicts on the full measurement plan for the
H100-like ``GENERATING`` parameters below, times a deterministic wobble ``1 + 0.03·u`` with
``u`` in [-1, 1) from a fixed linear congruential generator:

* GEMM: ``costmodels.compute.op_time("gemm", ...)`` (compute/memory roofline + overhead);
* attention: ``FLOPs / (peak · fraction) + overhead`` (FLOPs at full s², fractions per mask);
* copy: ``2·bytes / (hbm_bw · memory_fraction) + overhead``; tiny kernels: ``overhead``.

Regenerate (a test checks the stored file is exactly this output)::

    .venv/bin/python tests/autoplan/calibrate/data/make_synthetic.py > tests/autoplan/calibrate/data/synthetic_h100.yaml
"""
from __future__ import annotations

import yaml

import topologies
from autoplan.calibrate.plan import measurement_plan
from costmodels.compute import ComputeProfile, op_time
from costmodels.profile_fit import (
    AttentionSample,
    CopySample,
    GemmSample,
    Measurements,
    TinySample,
    measurements_to_mapping,
)

GPU = "h100"
WOBBLE = 0.03
GENERATING = {
    "gemm_peak_fraction": 0.78,
    "gemm_half_dim": 110.0,
    "attention_fwd_fraction": 0.62,        # causal mask, FLOPs counted at full s²
    "attention_bwd_fraction": 0.50,
    "attention_fwd_fraction_full_mask": 0.42,
    "attention_bwd_fraction_full_mask": 0.33,
    "memory_fraction": 0.88,
    "overhead_s": 4.5e-6,
}


class _Wobble:
    """``1 + size·u`` with u from the LCG x ← (1664525·x + 1013904223) mod 2³² (Numerical Recipes)."""

    def __init__(self, size: float, seed: int = 12345) -> None:
        self.size = size
        self.state = seed

    def __call__(self) -> float:
        self.state = (1664525 * self.state + 1013904223) % 2**32
        return 1.0 + self.size * (2.0 * self.state / 2**32 - 1.0)


def synthetic_measurements(wobble_size: float = WOBBLE) -> Measurements:
    """The cost model's times for ``GENERATING`` on the full plan, times ``1 + wobble_size·u``."""
    g = GENERATING
    spec = topologies.gpu_spec(GPU)
    profile = ComputeProfile(name="generating", gemm_peak_fraction=g["gemm_peak_fraction"],
                             gemm_half_dim=g["gemm_half_dim"],
                             attention_fwd_fraction=g["attention_fwd_fraction"],
                             attention_bwd_fraction=g["attention_bwd_fraction"],
                             memory_fraction=g["memory_fraction"], fusion=1.0,
                             overhead_s=g["overhead_s"])
    wobble = _Wobble(wobble_size)
    plan = measurement_plan()
    tiny = tuple(TinySample(name, g["overhead_s"] * wobble()) for name in plan.tiny_kernels)
    copies = tuple(CopySample(n, (2.0 * n / (spec.hbm_bw * g["memory_fraction"]) + g["overhead_s"]) * wobble())
                   for n in plan.copy_bytes)
    gemms = []
    for s in plan.gemms:
        probe = GemmSample(s.m, s.n, s.k, 1.0)
        t = op_time("gemm", probe.flops, probe.nbytes, peak_flops=spec.bf16_flops, hbm_bw=spec.hbm_bw,
                    profile=profile, gemm=(s.m, s.n, s.k))
        gemms.append(GemmSample(s.m, s.n, s.k, t * wobble()))
    attention = []
    for s in plan.attention:
        for direction in ("fwd", "bwd"):
            key = f"attention_{direction}_fraction" + ("" if s.causal else "_full_mask")
            probe = AttentionSample(direction, s.batch, s.heads, s.seq, s.head_dim, s.causal, 1.0)
            t = probe.flops / (spec.bf16_flops * g[key]) + g["overhead_s"]
            attention.append(AttentionSample(direction, s.batch, s.heads, s.seq, s.head_dim, s.causal,
                                             t * wobble()))
    return Measurements(
        device="SYNTHETIC H100-like surface (no GPU was run)",
        software="tests/autoplan/calibrate/data/make_synthetic.py", attention_kernel="flash",
        timing=f"synthetic: the cost model's own prediction x (1 + {WOBBLE}*u), u from a fixed LCG",
        gemm=tuple(gemms), attention=tuple(attention), copy=copies, tiny=tiny)


def synthetic_yaml() -> str:
    header = ("# SYNTHETIC TEST DATA -- NOT A MEASUREMENT.  No GPU was run to make this file.\n"
              "# Written by tests/autoplan/calibrate/data/make_synthetic.py from the H100-like\n"
              "# 'generating_parameters' below plus a deterministic +-3% wobble, so the tests can check\n"
              "# that costmodels/profile_fit.py recovers them.  Same layout as the 'measurements' of a\n"
              "# profile written by `autoplan calibrate`.\n")
    data = {"synthetic": True, "generating_parameters": GENERATING, "gpu": GPU,
            "measurements": measurements_to_mapping(synthetic_measurements())}
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


if __name__ == "__main__":
    print(synthetic_yaml(), end="")
