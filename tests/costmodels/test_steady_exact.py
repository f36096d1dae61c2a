"""The steady-state extrapolation's fast paths give the numbers of their one-at-a-time forms
bit for bit: the period matrix built a level at a time, and the cycle search screening on
probe coordinates."""
from __future__ import annotations

import numpy as np
import pytest

from costmodels.pipeline import steady
from costmodels.pipeline.events import StageTimes
from costmodels.pipeline.steady import REL_TOL, _period_matrix, _period_rows


def _rows_one_at_a_time(comp, per, dur_arr, times):
    inputs, image, _ = _period_rows(comp, per)
    n, k = len(per.frontier), len(per.period)
    forms = np.full((n + k + 1, n), -np.inf)
    forms[np.arange(n), np.arange(n)] = 0.0
    q = per.period
    lat1, lat2 = times.p2p[comp.bnd1[q]].tolist(), times.p2p[comp.bnd2[q]].tolist()
    for i, (r0, r1, r2), l1, l2, du in zip(range(n, n + k), inputs, lat1, lat2, dur_arr[q].tolist()):
        forms[i] = np.maximum(np.maximum(forms[r0], forms[r1] + l1), forms[r2] + l2) + du
    return forms[image]


def _advance_comparing_all(matrix, x, periods, scale):
    hist = np.empty((periods + 1, len(x)))
    hist[0] = x
    depth = 2 * len(x) + 2
    tol = REL_TOL * max(scale, 1e-300)
    for j in range(1, periods + 1):
        x = (matrix + x[None, :]).max(axis=1)
        hist[j] = x
        lo = max(0, j - depth)
        gaps = x[None, :] - hist[lo:j]
        same = np.flatnonzero(gaps.max(axis=1) - gaps.min(axis=1) <= tol)
        if same.size:
            i = lo + int(same[-1])
            q, r = divmod(periods - i, j - i)
            return hist[i + r] + q * float(gaps[same[-1]].max())
    return x


@pytest.mark.parametrize("schedule,p,v,c", [("1f1b", 8, 1, 1), ("zbv", 8, 2, 1), ("dualpipev", 6, 2, 1),
                                             ("zb-h2", 4, 1, 1), ("interleaved", 4, 2, 4), ("interleaved", 8, 3, 8)])
def test_fast_paths_are_the_one_at_a_time_forms_bit_for_bit(schedule, p, v, c):
    rng = np.random.default_rng(p * 10 + v)
    m_s = steady.short_size(schedule, p, v, c, 0)
    per = steady.find_period(schedule, p, m_s, v, c)
    n = p * v
    for trial in range(4):
        f = rng.uniform(0.5, 1.5, n) if trial else np.ones(n)
        times = StageTimes(f, 2 * f, 0.5 * f, np.zeros(n) if schedule != "dualpipev" else 0.3 * f,
                           np.zeros(n) if schedule != "dualpipev" else 0.4 * f, rng.uniform(0, 0.05, max(n - 1, 1)))
        comp, dur_arr, end = steady._simulate(schedule, p, m_s, v, times)
        matrix = _period_matrix(comp, per, dur_arr, times)
        assert np.array_equal(matrix, _rows_one_at_a_time(comp, per, dur_arr, times))
        x = end[per.image]
        for periods in (1, 7, 300):
            got = steady._advance(matrix, x, periods, float(end.max()))
            assert np.array_equal(got, _advance_comparing_all(matrix, x, periods, float(end.max())))


def _extrapolate_with_the_exact_scale(schedule, p, m, v, times):
    """``steady.extrapolate`` as it was: the whole short step simulated, its largest end the scale."""
    c = steady.period_microbatches(schedule, p, m)
    m_s = steady.reduced_sizes(schedule, p, m, v)[0]
    per = steady.find_period(schedule, p, m_s, v, c)
    comp, dur_arr, end = steady._simulate(schedule, p, m_s, v, times)
    _, tail, rank = steady._parts(comp, per)
    end = end.copy()
    periods = (m - m_s) // c
    end[per.image] = steady._advance(_period_matrix(comp, per, dur_arr, times), end[per.image], periods,
                                     float(end.max()))
    ends = steady.ends_list(len(end))
    ends[:len(end)] = end.tolist()
    steady._run_part(tail, dur_arr, ends, times)
    end = np.array(ends[:len(end)])
    busy = np.bincount(rank, weights=dur_arr, minlength=p) + periods * np.bincount(
        rank[per.period], weights=dur_arr[per.period], minlength=p)
    starts = [end[q] - dur_arr[q] for q in comp.first_pos]
    ends = [end[q] for q in comp.last_pos]
    return (float(max(ends) - min(starts)), float(max(e - s for s, e in zip(starts, ends))),
            tuple(float(x) for x in busy), comp.peak)


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 8, 64, 1), ("zb-h1", 6, 90, 1), ("zbv", 4, 60, 2),
                                            ("dualpipev", 4, 48, 2), ("interleaved", 4, 64, 2)])
def test_extrapolation_without_the_short_tail_is_the_exact_scale_one_bit_for_bit(schedule, p, m, v):
    """The tail of the short step is not simulated for the cycle tolerance's scale (bracketed
    instead): the same numbers as with the exact scale, and the bracket holds it."""
    rng = np.random.default_rng(p * m)
    n = p * v
    for trial in range(5):
        f = rng.uniform(0.5, 1.5, n) if trial else np.ones(n)
        f[0] *= 0.6 if trial % 2 else 1.0                # a lighter first stage: a long transient
        comm = 0.3 * f if schedule == "dualpipev" else np.zeros(n)
        times = StageTimes(f, 2 * f, 0.5 * f, comm, comm, np.append(rng.uniform(0, 0.05, n - 1), 0.0))
        got = steady.extrapolate(schedule, p, m, v, times, always=True)
        assert got == _extrapolate_with_the_exact_scale(schedule, p, m, v, times)
        m_s = steady.reduced_sizes(schedule, p, m, v)[0]
        per = steady.find_period(schedule, p, m_s, v, steady.period_microbatches(schedule, p, m))
        comp, dur_arr, end = steady._simulate(schedule, p, m_s, v, times)
        head, tail, _ = steady._parts(comp, per)
        assert end[head.at].max() <= end.max() <= steady._tail_bound(tail, dur_arr, times, float(end[head.at].max()))


def test_a_cycle_between_the_two_tolerances_is_left_to_the_exact_scale():
    """Coordinates drifting apart by 1e-11 a period: no cycle at tolerance 1e-12 · 1, a cycle at
    1e-12 · 100 — with the scale only known to lie in [1, 100] ``_advance`` does not guess."""
    matrix = np.array([[0.0, -np.inf], [-np.inf, 1e-11]])
    x = np.array([1.0, 1.0])
    exact = steady._advance(matrix, x, 5, 1.0)
    assert exact[1] - exact[0] == pytest.approx(5e-11, rel=1e-3)      # iterated through: no cycle
    assert steady._advance(matrix, x, 5, 1.0, upper=100.0) is None
    assert np.array_equal(steady._advance(matrix, x, 5, 1.0, upper=1.0), exact)
    assert np.array_equal(steady._advance(matrix, x, 5, 100.0), steady._advance(matrix, x, 5, 100.0, upper=100.0))
