"""One pipeline shape priced under many sets of stage times at once (a band's paired samples).

    extrapolate_many(schedule, p, m, v, [times, ...]) -> [(step, steady_step, busy, peak) | None, ...]

Entry k is ``steady.extrapolate(schedule, p, m, v, times[k])`` to the bit.  The samples of a
band share the shape (schedule, pp, m, vpp) — the compiled order, its split and its parts — and
differ only in the durations, so the two event passes of the extrapolation (the short step's
past C_T and the tail) run once for all samples: a *level* of a part (``steady._levels``: the
actions whose inputs in the part all lie in earlier levels) is one gather–max–add over an
(actions × samples) array instead of one Python step per action and sample.  Each end time is
the same max of the same sums as ``steady._run_part`` takes (a rank's predecessor, else 0;
each remote input's end + its p2p; then + the duration), so the floats are equal.  The
period matrices are built the same way, the samples a leading axis of the same level-wise
forms (``steady._period_matrix``), as many samples at once as fit the cache; the iteration
A^J ⊗ x and its cycle check stay per sample
(batched over samples, its products reduce a 3-D array along its middle axis: slower).

Where the period matrix would not pay off, the periods run one at a time, every sample at
once (``steady._run_periods``' sums, level by level).
``simulate_all`` is the same for a shape that does not extrapolate (GPipe; no short step with
a period): the whole step's levels, every sample at once, each end time the same max of the
same sums as ``events._run`` takes, so every entry is ``simulator._simulated``'s to the bit.
"""
from __future__ import annotations

import numpy as np

from costmodels.memo import memo
from costmodels.pipeline import steady
from costmodels.pipeline.events import Compiled, StageTimes, compile_schedule, durations, rank_predecessors

_Levels = tuple[tuple[np.ndarray, ...], ...]
"""Per level of a part: (positions, rank predecessor, input 1, its p2p boundary, input 2, its boundary)."""


def extrapolate_many(schedule: str, p: int, m: int, v: int,
                     times: list[StageTimes]) -> list[steady.Summary] | list[None]:
    """``steady.extrapolate`` of every entry of ``times`` (module docstring); all None where the
    shape does not extrapolate (no qualifying m_s, or an input of its period out of reach)."""
    c = steady.period_microbatches(schedule, p, m)
    sizes = steady.reduced_sizes(schedule, p, m, v)
    none = [None] * len(times)
    if not sizes:
        return none
    m_s = sizes[0]
    assert c is not None                        # reduced_sizes is empty where c is None
    per = steady.find_period(schedule, p, m_s, v, c)
    if per is None:
        return none
    comp = compile_schedule(schedule, p, m_s, v)
    if steady._period_rows(comp, per) is None:
        return none
    durs = [durations(comp, t) for t in times]
    periods = (m - m_s) // c
    _, tail, rank = steady._parts(comp, per)
    head_levels, tail_levels = _level_tables(comp, per)
    n, dur, p2p, end = _columns(comp, durs, times)
    _run_levels(head_levels, dur, end, p2p)
    matrix_path = steady._pays_off(per, m, m_s, c)
    if matrix_path:
        group = max(1, FORMS_PER_BATCH // ((len(per.frontier) + len(per.period) + 1) * len(per.frontier)))
        # ignore: not None, extrapolate_many returned above where _period_rows is None
        matrices = [a for lo in range(0, len(times), group)
                    for a in _period_matrices(comp, per, durs[lo:lo + group],  # type: ignore[union-attr]
                                              times[lo:lo + group])]
        for k, (d, t) in enumerate(zip(durs, times)):
            known = float(end[:n, k].max())
            x = steady._advance(matrices[k], end[per.image, k], periods, known,
                                upper=steady._tail_bound(tail, d, t, known))
            if x is None:                          # the exact scale: this sample's short-step tail
                short = end[:n, k].copy()
                steady._run_part(tail, durs[k], short, times[k])
                x = steady._advance(matrices[k], short[per.image], periods, float(short.max()))
            end[per.image, k] = x
    else:                                      # the periods one by one (``steady._run_periods``)
        work, levels = end.copy(), _period_levels(comp, per)
        for _ in range(periods):
            work[per.frontier] = work[per.image]
            _run_levels(levels, dur, work, p2p)
        end[per.image] = work[per.image]
    _run_levels(tail_levels, dur, end, p2p)
    return [steady.summary(comp, per, rank, d, end[:n, k], periods, p, in_order=not matrix_path)
            for k, d in enumerate(durs)]


def _columns(comp: Compiled, durs: list[np.ndarray],
             times: list[StageTimes]) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(actions n, durations and p2p with the samples as columns, ``_run_levels``' end array:
    row n 0 (no rank predecessor), row n + 1 −inf (no input))."""
    n = len(comp.rank)
    end = np.zeros((n + 2, len(times)))
    end[n + 1] = -np.inf
    return n, np.stack(durs, axis=1), np.stack([t.p2p for t in times], axis=1), end


@memo(256)
def _period_levels(comp: Compiled, per: steady.Period) -> _Levels:
    """``_run_levels``' tables of one period's actions (``steady.period_part``)."""
    return _levels_of(steady.period_part(comp, per), len(comp.rank))


def simulate_all(schedule: str, p: int, m: int, v: int, times: list[StageTimes]) -> list[steady.Summary]:
    """(step, steady_step, busy, peak) of the whole m step under every entry of ``times``, as
    ``simulator._simulated`` prices one run (module docstring)."""
    comp = compile_schedule(schedule, p, m, v)
    durs = [durations(comp, t) for t in times]
    _, dur, p2p, end = _columns(comp, durs, times)
    _run_levels(_whole_step_levels(comp), dur, end, p2p)
    rank = np.asarray(comp.rank)
    out = []
    for k, d in enumerate(durs):
        starts = end[comp.first_pos, k] - d[comp.first_pos]
        ends = end[comp.last_pos, k]
        busy = np.bincount(rank, weights=d, minlength=p)
        out.append((float(ends.max() - starts.min()), float((ends - starts).max()),
                    tuple(float(x) for x in busy), comp.peak))
    return out


@memo(64)
def _whole_step_levels(comp: Compiled) -> _Levels:
    """``_run_levels``' tables of every action of ``comp``: its rank predecessor is the rank's
    previous action in the topological order (which keeps each rank's order)."""
    return _levels_of(steady.part_of(comp, rank_predecessors(comp), np.arange(len(comp.rank))), len(comp.rank))


FORMS_PER_BATCH = 1 << 18      # period-matrix forms built at once (floats): more leave the cache and run slower


def _period_matrices(comp: Compiled, per: steady.Period, durs: list[np.ndarray],
                     times: list[StageTimes]) -> np.ndarray | None:
    """``steady._period_matrix`` of every sample, stacked (sample, row, column): the same
    forms, level by level, with the samples as a leading axis; None where the period's
    structure has an input out of reach (a property of the shape).  The caller keeps the
    samples × forms under ``FORMS_PER_BATCH``."""
    rows = steady._period_rows(comp, per)
    if rows is None:
        return None
    n, k = len(per.frontier), len(per.period)
    forms = np.empty((len(durs), n + k + 1, n))     # the period's rows are all written, level by level
    forms[:, :n] = -np.inf
    forms[:, np.arange(n), np.arange(n)] = 0.0
    forms[:, n + k] = -np.inf
    q = per.period
    p2p = np.stack([t.p2p for t in times])
    zero = np.zeros((len(durs), k))
    lat = np.stack([zero, p2p[:, comp.bnd1[q]], p2p[:, comp.bnd2[q]]], axis=1)[:, :, :, None]
    du = np.stack([d[q] for d in durs])[:, :, None]
    for at, inputs in rows[2]:        # as steady._period_matrix, every sample at once
        forms[:, at + n] = (forms[:, inputs] + lat[:, :, at]).max(axis=1) + du[:, at]
    return forms[:, rows[1]]


@memo(256)
def _level_tables(comp: Compiled, per: steady.Period) -> tuple[_Levels, ...]:
    """Per part (the past C_T, the tail): per level (positions, rank predecessor, remote inputs
    1 and 2, their p2p boundaries), the missing predecessor mapped to row n (end 0) and a missing
    input to row n + 1 (end −inf) of ``_run_levels``' end array."""
    n = len(comp.rank)
    return tuple(_levels_of(part, n) for part in steady._parts(comp, per)[:2])


def _levels_of(part: steady._Part, n: int) -> _Levels:
    at = np.asarray(part.at, dtype=np.int64)
    prev = np.asarray(part.prev, dtype=np.int64)
    dep1 = np.asarray(part.dep1, dtype=np.int64)
    dep2 = np.asarray(part.dep2, dtype=np.int64)
    prev = np.where(prev >= 0, prev, n)
    dep2 = np.where((dep1 >= 0) & (dep2 >= 0), dep2, n + 1)      # a second input counts only after a first
    dep1 = np.where(dep1 >= 0, dep1, n + 1)
    bounds = list(part.level_starts) + [len(at)]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        idx = part.by_level[lo:hi]
        out.append((at[idx], prev[idx], dep1[idx], part.bnd1[idx], dep2[idx], part.bnd2[idx]))
    return tuple(out)


def _run_levels(levels: _Levels, dur: np.ndarray, end: np.ndarray, p2p: np.ndarray) -> None:
    """End times of a part's actions for every sample (columns), a level at a time:
    end = max(end[predecessor], end[input 1] + p2p, end[input 2] + p2p) + duration."""
    for q, prev, d1, b1, d2, b2 in levels:
        t = np.maximum(end[prev], end[d1] + p2p[b1])
        np.maximum(t, end[d2] + p2p[b2], out=t)
        t += dur[q]
        end[q] = t
