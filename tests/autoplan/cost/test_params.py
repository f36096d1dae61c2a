"""The uncertain parameters (``autoplan.cost.params``): ``fp8_gemm_peak`` moves the FP8 GEMM
fraction alone, so an FP8 plan's band carries the FP8 fit's own error and a BF16 plan's band is
what it was before the parameter existed."""
import dataclasses

import pytest

from autoplan.cost import Estimator
from autoplan.cost.params import PARAM_NAMES, Params, perturb_profile, ranges
from autoplan.cost.uncertainty import Sampler, draw
from autoplan.plan import Plan
from costmodels.compute import load_profile

MODEL = "gpt:layers=4,hidden=2048,heads=16,vocab=32000"
BF16 = "tp=2,pp=1,dp=8,mbs=2"
FP8 = BF16 + ",precision=fp8"


def test_fp8_gemm_peak_moves_the_fp8_fraction_alone_capped_at_one():
    h100 = load_profile("h100")                               # gemm_peak_fraction 0.7, FP8 0.6
    got = perturb_profile(h100, Params(fp8_gemm_peak=1.1))
    assert got.fp8_gemm_peak_fraction == pytest.approx(0.6 * 1.1)
    assert dataclasses.replace(got, fp8_gemm_peak_fraction=h100.fp8_gemm_peak_fraction) == h100
    both = perturb_profile(h100, Params(gemm_peak=0.9, fp8_gemm_peak=1.1))   # gemm_peak still moves both
    assert (both.gemm_peak_fraction, both.fp8_gemm_peak_fraction) == pytest.approx((0.7 * 0.9, 0.6 * 0.9 * 1.1))
    assert perturb_profile(h100, Params(fp8_gemm_peak=2.0)).fp8_gemm_peak_fraction == 1.0
    # a profile without its own FP8 fraction prices FP8 at its BF16 one (b200: 0.72): that one moves
    b200 = load_profile("b200")
    assert b200.fp8_gemm_peak_fraction == 0.0
    assert perturb_profile(b200, Params(fp8_gemm_peak=0.9)).fp8_gemm_peak_fraction == pytest.approx(0.72 * 0.9)
    assert perturb_profile(b200, Params(fp8_gemm_peak=0.9)).gemm_peak_fraction == 0.72


def test_the_new_parameter_leaves_every_other_parameters_samples_as_they_were():
    """It is drawn last: without it (the ranges before it existed) the draw is the same."""
    rs = ranges("h100")
    assert PARAM_NAMES[-1] == "fp8_gemm_peak" and rs[-1].low < 1.0 < rs[-1].high
    for seed in (0, 1):
        with_it = draw(rs, 24, seed)
        assert [dataclasses.replace(p, fp8_gemm_peak=1.0) for p in with_it] == list(draw(rs[:-1], 24, seed))
        assert len({p.fp8_gemm_peak for p in with_it}) == 24


def _bands(setup):
    """Each plan's band on 8 paired samples, and on the same samples with ``fp8_gemm_peak`` held
    at 1 (what the draw was before the parameter existed), and the samples' FP8 multipliers."""
    graph, cluster, _ = setup(MODEL, "h100x16")
    point = Estimator(graph, cluster)
    sampler, held = Sampler(point, 8, seed=0), Sampler(point, 8, seed=0)
    held.params = tuple(dataclasses.replace(p, fp8_gemm_peak=1.0) for p in sampler.params)
    out = {}
    for name, text in (("bf16", BF16), ("fp8", FP8)):
        plan = Plan.parse(text, num_gpus=16)
        e = point.estimate(plan, 64)
        out[name] = (sampler.band(plan, 64, e), held.band(plan, 64, e))
    return out, [p.fp8_gemm_peak for p in sampler.params]


def test_an_fp8_plans_band_widens_and_a_bf16_plans_band_is_unchanged(setup):
    bands, multipliers = _bands(setup)
    bf16, before = bands["bf16"]
    assert bf16.step_s == before.step_s                        # bit for bit: BF16 never reads the FP8 fraction
    fp8, before = bands["fp8"]
    assert fp8.step(0.9) - fp8.step(0.1) > before.step(0.9) - before.step(0.1) > 0.0
    # each sample's FP8 step moves the way its FP8 multiplier says: a faster FP8 GEMM (> 1), a
    # shorter step than with the multiplier held at 1, and the reverse
    assert [t < h for t, h in zip(fp8.step_s, before.step_s)] == [m > 1.0 for m in multipliers]
