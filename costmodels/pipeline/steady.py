"""A long pipeline step priced from a short one: exact steady-state extrapolation.

Every schedule here (GPipe aside) is, away from its warm-up and cool-down, *periodic*:
with c micro-batches per period (c = 1; the group size g for Megatron interleaved), the
order for m + c micro-batches is the order for m with one more steady period, and an op
(kind, i, s) of the steady state has the same kind of inputs as (kind, i + c, s), shifted
by c.  Key every action by the micro-batch of its first op.  For a split S, the *frontier*
F_S = the actions keyed below S that some action keyed >= S waits for (its rank
predecessor or a remote input); every later time is a max-plus function of the frontier's
end times, and that function is homogeneous (adding a constant to every input adds it to
every output).  So if the shift σ (i → i + c) maps F_S onto F_{S+c} and, in a simulation,

    end(σ x) − end(x) = δ   for every x in F_S                           (*)

then every further period repeats the one before it δ later, and a step of m micro-batches
equals a simulated step of m_s ≡ m (mod c) micro-batches with J = (m − m_s) / c periods
inserted: actions keyed >= T = S + c (the tail) end J·δ later, the rest unchanged, and each
rank's busy time grows by J times its busy time over one period (the actions keyed in
[S, T)).  Peak activations are those of the m_s step (the live count is periodic).

(*) is a check on simulated numbers, not an assumption: when the transient (uneven stages
let two near-critical paths compete for a while) has not died out within the m_s step,
a twice longer m_s is tried, then the full simulation.  The structure — σ well defined on
F_S ∪ [S, T), σ F_S = F_{S+c}, rank predecessors and remote inputs shifted alike — is
checked on the compiled m_s order; that the m order is the m_s order with inserted
periods is a property of the generators in schedules.py, tested against the full
simulation for every schedule (tests/costmodels/test_pipeline.py).  Cost: one pass over
the m_s step (m_s ≈ 4–8 pp micro-batches), independent of m.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from costmodels.pipeline.events import (Compiled, StageTimes, compile_schedule, durations,
                                        run_compiled)
from costmodels.pipeline.schedules import get_spec, interleaved_group_size

REL_TOL = 1e-12       # (*) holds to this share of the step's largest end time


@dataclass(frozen=True)
class Period:
    """Where the compiled m_s step is split (module docstring)."""

    split: int                  # T: actions keyed >= T are the tail
    frontier: np.ndarray        # positions of F_S
    image: np.ndarray           # positions of σ F_S (same order)
    period: np.ndarray          # positions of the actions keyed in [S, T)
    key: np.ndarray             # micro-batch key of every action


def period_microbatches(schedule: str, p: int, m: int) -> int | None:
    """c, or None where the step is not one periodic steady state (GPipe runs all
    forwards, then all backwards: two)."""
    if schedule == "gpipe":
        return None
    return interleaved_group_size(p, m) if schedule == "interleaved" else 1


# Shortest step, in units of max(pp, c) micro-batches, whose compiled order holds a split
# of the steady state (warm-up + frontier + one period + cool-down; measured with
# find_period for pp = 2..16), plus one unit for the transient to die out in.
_SPAN = {"1f1b": 3, "zb-h1": 3, "dualpipev": 4, "zbv": 5, "zb-h2": 6, "interleaved": 7}


def reduced_sizes(schedule: str, p: int, m: int, v: int) -> list[int]:
    """m_s candidates, shortest first: ≡ m (mod c), from _SPAN·max(pp, c) micro-batches,
    doubling while m_s <= m/2 (a transient that outlasts a short step is caught by (*));
    empty when extrapolation cannot pay off."""
    c = period_microbatches(schedule, p, m)
    if c is None:
        return []
    base = max(_SPAN[schedule] * max(p, c), get_spec(schedule).min_microbatches(p))
    out = []
    while 2 * base <= m:
        m_s = base + (m - base) % c
        if schedule != "interleaved" or interleaved_group_size(p, m_s) == c:
            out.append(m_s)
        base *= 2
    return out


@lru_cache(maxsize=256)
def find_period(schedule: str, p: int, m_s: int, v: int, c: int) -> Period | None:
    """The latest split S of the compiled m_s step whose structure satisfies the module
    docstring's conditions, or None."""
    comp = compile_schedule(schedule, p, m_s, v)
    n = len(comp.ops)
    key = np.array([act[0][1] for act in comp.ops])
    sigma, preds = _shift_map(comp, c)
    # maxsucc[x]: largest key among the actions waiting for x (−1 if none)
    maxsucc = np.full(n, -1)
    for q, ps in enumerate(preds):
        for x in ps:
            maxsucc[x] = max(maxsucc[x], key[q])
    valid = sigma >= 0
    for s_split in range(m_s - 2 * c, 0, -1):
        front = np.flatnonzero((key < s_split) & (maxsucc >= s_split))
        period = np.flatnonzero((key >= s_split) & (key < s_split + c))
        if not (valid[front].all() and valid[period].all()):
            continue
        nxt = np.flatnonzero((key < s_split + c) & (maxsucc >= s_split + c))
        image = sigma[front]
        if np.array_equal(np.sort(image), nxt):
            return Period(s_split + c, front, image, period, key)
    return None


def _shift_map(comp: Compiled, c: int) -> tuple[np.ndarray, list[list[int]]]:
    """σ on action positions (−1 where the shifted action is missing or differently
    shaped or waits on differently shifted inputs) and every action's predecessors."""
    n = len(comp.ops)
    where = {op: q for q, act in enumerate(comp.ops) for op in act}
    prev, last = [-1] * n, [-1] * len(comp.first_pos)
    for q, r in enumerate(comp.rank):
        prev[q], last[r] = last[r], q
    preds = [[x for x in (prev[q], comp.dep1[q], comp.dep2[q]) if x >= 0] for q in range(n)]
    sigma = np.full(n, -1)
    for q, act in enumerate(comp.ops):
        images = {where.get((k, i + c, s), -1) for k, i, s in act}
        if len(images) == 1 and -1 not in images:
            q2 = images.pop()
            if len(comp.ops[q2]) == len(act):
                sigma[q] = q2
    shifted = sigma.copy()      # inputs must shift alike (the rank predecessor included)
    for q in range(n):
        q2 = sigma[q]
        if q2 >= 0 and (any(sigma[x] < 0 for x in preds[q])
                        or sorted(sigma[x] for x in preds[q]) != sorted(preds[q2])):
            shifted[q] = -1
    return shifted, preds


def extrapolate(schedule: str, p: int, m: int, v: int, times: StageTimes):
    """(step_time, steady_step_time, busy, peak_activations) of an m step from a shorter
    simulated one, or None where no m_s qualifies (then simulate in full)."""
    c = period_microbatches(schedule, p, m)
    for m_s in reduced_sizes(schedule, p, m, v):
        per = find_period(schedule, p, m_s, v, c)
        if per is None:
            continue
        comp = compile_schedule(schedule, p, m_s, v)
        dur_arr = durations(comp, times)
        dur = dur_arr.tolist()
        end = np.asarray(run_compiled(comp, dur, times))
        gaps = end[per.image] - end[per.frontier]
        if gaps.size == 0 or np.ptp(gaps) > REL_TOL * max(float(end.max()), 1e-300):
            continue
        shift = (m - m_s) // c * float(gaps.max())
        rank = np.asarray(comp.rank)
        busy = np.bincount(rank, weights=dur_arr, minlength=p) + (m - m_s) // c * np.bincount(
            rank[per.period], weights=dur_arr[per.period], minlength=p)
        moved = per.key >= per.split
        starts = [end[q] - dur[q] + (shift if moved[q] else 0.0) for q in comp.first_pos]
        ends = [end[q] + (shift if moved[q] else 0.0) for q in comp.last_pos]
        step = max(ends) - min(starts)
        steady_step = max(e - s for s, e in zip(starts, ends))
        return float(step), float(steady_step), tuple(float(x) for x in busy), comp.peak
    return None
