"""costmodels.pipeline.bounds: the peak without simulating, and a makespan lower bound that
holds for every schedule, shape and duration (and is tight where the closed forms are)."""
from __future__ import annotations

import numpy as np
import pytest

from costmodels.pipeline import SCHEDULES, simulate
from costmodels.pipeline.bounds import makespan_lower_bound, peak_activations, steady_lower_bound

CHUNKS = {"gpipe": (1,), "1f1b": (1,), "interleaved": (2, 3), "zb-h1": (1,), "zb-h2": (1,),
          "zbv": (2,), "dualpipev": (2,)}


def _shapes(schedule):
    for p in (1, 2, 3, 4, 8):
        for v in CHUNKS[schedule]:
            if p == 1 and v > 1:
                continue
            lo = max(SCHEDULES[schedule].min_microbatches(p), 1)
            for m in sorted({lo, lo + 1, 2 * p + 1, 3 * p + 2, 8 * p, 20 * p + 1}):
                if schedule == "interleaved" and m % p:
                    continue
                yield p, v, m


def _times(rng, n, mode):
    if mode == "equal":
        return np.ones(n), np.ones(n), np.ones(n), 0.0
    if mode == "head":
        f = np.full(n, 0.5)
        f[0] += 3.0
        f[-1] += 2.0
        return f, 2 * f, np.full(n, 0.6), 0.05
    return rng.uniform(0.2, 2.0, n), rng.uniform(0.2, 3.0, n), rng.uniform(0.0, 1.5, n), \
        float(rng.uniform(0, 0.3))


@pytest.mark.parametrize("schedule", sorted(CHUNKS))
def test_peak_without_simulation_equals_the_simulated_peak(schedule):
    for p, v, m in _shapes(schedule):
        n = p * v
        ones = [1.0] * n
        for exact in (False, True):
            sim = simulate(schedule, stages=p, microbatches=m, chunks=v, f=ones, b=ones, w=ones, exact=exact)
            assert peak_activations(schedule, p, m, v) == sim.peak_activations, (p, v, m, exact)


@pytest.mark.parametrize("schedule", sorted(CHUNKS))
def test_makespan_bound_never_exceeds_the_simulated_step(schedule):
    rng = np.random.default_rng(3)
    for p, v, m in _shapes(schedule):
        for mode in ("equal", "head", "random", "random"):
            f, b, w, p2p = _times(rng, p * v, mode)
            step = simulate(schedule, stages=p, microbatches=m, chunks=v, f=f, b=b, w=w, p2p=p2p,
                            exact=True).step_time
            bound = makespan_lower_bound(schedule, p, m, v, f.tolist(), b.tolist(), w.tolist(), p2p)
            assert bound <= step * (1 + 1e-12), (schedule, p, v, m, mode, bound, step)
            assert bound > 0.0


def test_paired_bound_holds_with_hidden_communication():
    """DualPipeV with communication a pair can hide (any share of f and b): the bound prices each op
    at its compute share and stays below the simulated step; without it, within 2/3 of the step."""
    rng = np.random.default_rng(5)
    checked = 0
    for p, v, m in _shapes("dualpipev"):
        for mode in ("equal", "head", "random", "random"):
            f, b, w, p2p = _times(rng, p * v, mode)
            for share in (0.0, 0.3, 1.0):
                fc, bc = f * share * rng.uniform(0, 1, p * v), b * share * rng.uniform(0, 1, p * v)
                step = simulate("dualpipev", stages=p, microbatches=m, chunks=v, f=f, b=b, w=w, p2p=p2p,
                                f_comm=fc, b_comm=bc, exact=True).step_time
                bound = makespan_lower_bound("dualpipev", p, m, v, f.tolist(), b.tolist(), w.tolist(), p2p,
                                             fc.tolist(), bc.tolist())
                assert bound <= step * (1 + 1e-12), (p, v, m, mode, share, bound, step)
                if share == 0.0:
                    assert bound >= step * 2 / 3, (p, v, m, mode, bound, step)
                checked += 1
    assert checked >= 100


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_makespan_bound_is_exact_for_1f1b_at_equal_stages(schedule):
    """(m + p − 1)(f + b + w): the head of the last rank, its work and the BW chain after it."""
    for p, m in ((2, 5), (4, 16), (8, 33)):
        bound = makespan_lower_bound(schedule, p, m, 1, [1.0] * p, [1.0] * p, [1.0] * p, 0.0)
        assert bound == pytest.approx((m + p - 1) * 3.0, rel=1e-12)


def test_makespan_bound_is_tight_for_zb_h1_at_equal_stages():
    """ZB-H1's bubble at f = b = w is (p − 1)·f (closed_form: (p−1)(f+b−w)); the bound sees it
    through rank 0's wait for its first backward, which at most p forwards can fill."""
    p, m = 8, 64
    ones = [1.0] * p
    step = simulate("zb-h1", stages=p, microbatches=m, f=ones, b=ones, w=ones, exact=True).step_time
    assert makespan_lower_bound("zb-h1", p, m, 1, ones, ones, ones, 0.0) == pytest.approx(step, rel=1e-12)


@pytest.mark.parametrize("schedule", sorted(CHUNKS))
def test_steady_bound_never_exceeds_the_simulated_steady_step(schedule):
    """Under optimizer post-validation the pipeline costs its steady step; its floor holds too."""
    rng = np.random.default_rng(5)
    for p, v, m in _shapes(schedule):
        for mode in ("equal", "head", "random"):
            f, b, w, p2p = _times(rng, p * v, mode)
            steady = simulate(schedule, stages=p, microbatches=m, chunks=v, f=f, b=b, w=w, p2p=p2p,
                              exact=True).steady_step_time
            bound = steady_lower_bound(schedule, p, m, v, f.tolist(), b.tolist(), w.tolist())
            assert 0.0 < bound <= steady * (1 + 1e-12), (schedule, p, v, m, mode, bound, steady)
