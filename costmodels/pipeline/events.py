"""The pipeline simulator's engine: a schedule's orders compiled to a dependency DAG, and
one pass over it.

``compile_schedule(schedule, pp, m, chunks)`` numbers every action, finds each one's
inputs (module docstring of costmodels.pipeline.simulator), sorts them topologically
(which also proves the order deadlock-free) and keeps flat arrays; it depends only on
the shape and is cached.  ``run_compiled`` then visits the actions once: an action ends
at max(its rank free, each remote input's end + p2p) + its duration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from costmodels.memo import memo
from costmodels.pipeline.schedules import (
    BW,
    KIND_NAMES,
    Action,
    B,
    F,
    RankOrder,
    W,
    get_spec,
    shared_orders,
    stage_rank,
)


@dataclass(frozen=True, eq=False)
class Compiled:
    """A schedule's actions in a topological order, as flat lists indexed by position.  Equal
    (and hashed) by ``shape``, what it was compiled from: memos of it key on that value."""

    rank: list[int]              # rank of each action
    dep1: list[int]              # position of the first cross-rank input, -1 if none
    dep2: list[int]              # second one (only overlapped pairs have two), -1 if none
    bnd1: np.ndarray             # boundary whose p2p delays dep1 (s−1→s is s−1), -1 if none
    bnd2: np.ndarray
    op_kind: np.ndarray          # for single-op actions: kind; pairs: -1
    op_stage: np.ndarray         # stage of the single op; pairs: stage of the F
    pair_pos: np.ndarray         # positions of overlapped pairs
    pair_f_stage: np.ndarray
    pair_b_stage: np.ndarray
    first_pos: list[int]         # per rank: position of its first and last action
    last_pos: list[int]
    ops: list[tuple[tuple[int, int, int], ...]]   # ops of each action, for the timeline
    peak: tuple[int, ...]
    op_table: np.ndarray         # (actions, 2, 3): each action's ops (kind, micro-batch, stage); no second: −1
    shape: tuple[str, int, int, int]   # (schedule, pp, m, chunks): compile_schedule's arguments

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compiled) and self.shape == other.shape

    def __hash__(self) -> int:
        return hash(self.shape)


def _deadlock_error(schedule: str, orders: list[RankOrder], ptr: list[int]) -> RuntimeError:
    heads = [f"rank {r}: {KIND_NAMES[o[ptr[r]][0][0]]}(mb {o[ptr[r]][0][1]}, "
             f"stage {o[ptr[r]][0][2]})" for r, o in enumerate(orders) if ptr[r] < len(o)]
    return RuntimeError(f"pipeline schedule {schedule!r} deadlocks (a bug in its order); "
                        f"blocked heads: {'; '.join(heads[:6])}")


@memo(512, shared=True)  # ~2.5 MB per entry at pp=16, m=128, v=3; most are far smaller
def compile_schedule(schedule: str, p: int, m: int, v: int) -> Compiled:
    """The schedule's orders as a ``Compiled`` DAG: every action numbered (rank by rank),
    each op's provider and input found with array arithmetic (``_inputs``), then the
    topological order (``_topological``) and the flat arrays in it."""
    orders = shared_orders(schedule, p, m, v)
    n_stages = p * v
    place = np.array([stage_rank(s, p, get_spec(schedule).placement) for s in range(n_stages)], dtype=np.int64)
    rank_ids: list[list[int]] = []
    act_ops: list[Action] = []
    act_rank: list[int] = []
    for r, acts in enumerate(orders):
        rank_ids.append(list(range(len(act_ops), len(act_ops) + len(acts))))
        act_ops.extend(acts)
        act_rank.extend([r] * len(acts))
    ops = np.array([(a, k, i, s) for a, act in enumerate(act_ops) for k, i, s in act], dtype=np.int64).reshape(-1, 4)
    rank = np.asarray(act_rank, dtype=np.int64)
    bad = np.flatnonzero(place[ops[:, 3]] != rank[ops[:, 0]])
    if bad.size:
        a, _, _, s = ops[bad[0]]
        raise RuntimeError(f"{schedule}: stage {s} scheduled on rank {rank[a]}, placed on rank {place[s]}")
    src, bnd = _inputs(schedule, ops, n_stages, m)
    # per action its (at most two) inputs in op order, an action's own op dropped
    n = len(act_ops)
    keep = (src >= 0) & (src != ops[:, 0])
    first = np.full(n, -1, dtype=np.int64)
    second = np.full(n, -1, dtype=np.int64)
    first_b, second_b = first.copy(), second.copy()
    later = np.r_[False, ops[1:, 0] == ops[:-1, 0]]          # the second op of a pair
    one = keep & ~later
    first[ops[one, 0]], first_b[ops[one, 0]] = src[one], bnd[one]
    two = keep & later
    has_first = first[ops[two, 0]] >= 0
    act2 = ops[two, 0]
    second[act2[has_first]], second_b[act2[has_first]] = src[two][has_first], bnd[two][has_first]
    first[act2[~has_first]], first_b[act2[~has_first]] = src[two][~has_first], bnd[two][~has_first]
    topo, pos = _topological(schedule, orders, rank_ids, first, second)
    table = np.full((n, 2, 3), -1, dtype=np.int64)
    table[ops[~later, 0], 0] = ops[~later, 1:]
    table[ops[later, 0], 1] = ops[later, 1:]
    return _flat(schedule, orders, act_ops, rank, rank_ids, topo, pos, (first, first_b, second, second_b),
                 _peaks_of(ops, rank, p), table, (schedule, p, m, v))


def _inputs(schedule: str, ops: np.ndarray, n_stages: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op (action, kind, micro-batch, stage): the action providing its input and the p2p
    boundary in between (−1: none), by the rules of the simulator's module docstring; a BW
    provides both B and W.  Raises where an op is scheduled twice or never."""
    a, k, i, s = ops.T
    provided = np.concatenate([np.where(k == BW, B, k), np.full(int((k == BW).sum()), W)])
    by = np.concatenate([a, a[k == BW]])
    key = (provided * n_stages + np.concatenate([s, s[k == BW]])) * m + np.concatenate([i, i[k == BW]])
    provider = np.full(3 * n_stages * m, -1, dtype=np.int64)
    counts = np.bincount(key, minlength=3 * n_stages * m)
    if (counts > 1).any():
        kk, rest = divmod(int(np.flatnonzero(counts > 1)[0]), n_stages * m)
        raise RuntimeError(f"{schedule}: {KIND_NAMES[kk]}(mb {rest % m}, stage {rest // m}) scheduled twice")
    provider[key] = by
    if (provider < 0).any():
        kk, rest = divmod(int(np.flatnonzero(provider < 0)[0]), n_stages * m)
        raise RuntimeError(f"{schedule}: {KIND_NAMES[kk]}(mb {rest % m}, stage {rest // m}) is never scheduled")

    def at(kind: int, stage: np.ndarray) -> np.ndarray:
        got: np.ndarray = provider[(kind * n_stages + np.clip(stage, 0, n_stages - 1)) * m + i]
        return got

    last = s == n_stages - 1
    src = np.where(k == F, np.where(s == 0, -1, at(F, s - 1)),
                   np.where(k == W, at(B, s), np.where(last, at(F, s), at(B, s + 1))))
    bnd = np.where(k == F, np.where(s == 0, -1, s - 1), np.where((k == W) | last, -1, s))
    return src, bnd


def _topological(schedule: str, orders: list[RankOrder], rank_ids: list[list[int]], first: np.ndarray,
                 second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Advance every rank as far as its inputs allow, repeat (an input later in the same rank's
    order, or a cycle across ranks, stalls every rank): (actions in that order, each action's
    position)."""
    n = len(first)
    pos = [-1] * n + [0]                   # index n: "no input", always placed
    d1 = np.where(first >= 0, first, n).tolist()
    d2 = np.where(second >= 0, second, n).tolist()
    ptr = [0] * len(rank_ids)
    sizes = [len(ids) for ids in rank_ids]
    topo: list[int] = []
    placed = 0
    while placed < n:
        before = placed
        for r, ids in enumerate(rank_ids):
            j, size = ptr[r], sizes[r]
            while j < size:
                a = ids[j]
                if pos[d1[a]] < 0 or pos[d2[a]] < 0:
                    break
                pos[a] = placed
                placed += 1
                j += 1
            topo.extend(ids[ptr[r]:j])
            ptr[r] = j
        if placed == before:
            raise _deadlock_error(schedule, orders, ptr)
    return np.asarray(topo, dtype=np.int64), np.asarray(pos[:n], dtype=np.int64)


def _peaks_of(ops: np.ndarray, act_rank: np.ndarray, p: int) -> tuple[int, ...]:
    """``_peak_in_flight`` from the op array (action, kind, micro-batch, stage; actions numbered
    rank by rank): live after an action's forwards = the rank's running sum of forwards less
    frees before it, plus its forwards; the peak is the largest, at least 0."""
    n = len(act_rank)
    plus = np.bincount(ops[ops[:, 1] == F, 0], minlength=n)
    minus = np.bincount(ops[(ops[:, 1] == BW) | (ops[:, 1] == W), 0], minlength=n)
    total = np.cumsum(plus - minus)
    counts = np.bincount(act_rank, minlength=p)
    first = np.cumsum(counts) - counts
    base = np.where(counts > 0, total[np.minimum(first, n - 1)] - (plus - minus)[np.minimum(first, n - 1)], 0)
    live = total - np.repeat(base, counts) + minus
    peak = np.zeros(p, dtype=np.int64)
    np.maximum.at(peak, act_rank, live)
    return tuple(int(x) for x in peak)


def _flat(schedule: str, orders: list[RankOrder], act_ops: list[Action], act_rank: np.ndarray,
          rank_ids: list[list[int]], topo: np.ndarray, pos: np.ndarray,
          inputs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], peak: tuple[int, ...],
          table: np.ndarray, shape: tuple[str, int, int, int]) -> Compiled:
    """The ``Compiled`` arrays in topological order.  Inputs on the same rank ran earlier in its
    order (the sort checked it), so the rank's own clock already covers them; only remote inputs
    are kept."""
    first, first_b, second, second_b = (x[topo] for x in inputs)
    rank = act_rank[topo]
    cross1 = (first >= 0) & (act_rank[np.maximum(first, 0)] != rank)
    cross2 = (second >= 0) & (act_rank[np.maximum(second, 0)] != rank)
    dep1 = np.where(cross1, pos[np.maximum(first, 0)], np.where(cross2, pos[np.maximum(second, 0)], -1))
    bnd1 = np.where(cross1, first_b, np.where(cross2, second_b, -1))
    dep2 = np.where(cross1 & cross2, pos[np.maximum(second, 0)], -1)
    bnd2 = np.where(cross1 & cross2, second_b, -1)
    ops = [act_ops[a] for a in topo.tolist()]
    table = table[topo]
    paired = table[:, 1, 0] >= 0
    bad = np.flatnonzero(paired & ((table[:, 0, 0] != F) | (table[:, 1, 0] != BW)))
    if bad.size:
        raise RuntimeError(f"{schedule}: overlapped pair must be (F, BW), got {ops[int(bad[0])]}")
    pair_pos = np.flatnonzero(paired)
    return Compiled(rank.tolist(), dep1.tolist(), dep2.tolist(), bnd1, bnd2, np.where(paired, -1, table[:, 0, 0]),
                    table[:, 0, 2].copy(), pair_pos, table[pair_pos, 0, 2], table[pair_pos, 1, 2],
                    [int(pos[ids[0]]) for ids in rank_ids], [int(pos[ids[-1]]) for ids in rank_ids],
                    ops, peak, table, shape)


def rank_predecessors(comp: Compiled) -> np.ndarray:
    """Per action (topological order) the position of its rank's previous action, −1 for a
    rank's first: the topological order keeps each rank's order."""
    rank = np.asarray(comp.rank)
    order = np.argsort(rank, kind="stable")
    prev = np.full(len(rank), -1, dtype=np.int64)
    same = rank[order][1:] == rank[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _peak_in_flight(orders: list[RankOrder]) -> tuple[int, ...]:
    """Per-rank peak of live forward chunks: F adds one, BW (or W) frees one.  Within an
    overlapped pair the forward counts before the backward frees (conservative)."""
    peaks = []
    for acts in orders:
        live = peak = 0
        for act in acts:
            for op in act:
                if op[0] == F:
                    live += 1
            if live > peak:
                peak = live
            for op in act:
                if op[0] == BW or op[0] == W:
                    live -= 1
        peaks.append(peak)
    return tuple(peaks)


class StageTimes(NamedTuple):
    """Checked per-virtual-stage times (seconds) and per-boundary p2p (trailing 0)."""

    f: np.ndarray
    b: np.ndarray
    w: np.ndarray
    f_comm: np.ndarray
    b_comm: np.ndarray
    p2p: np.ndarray


def durations(c: Compiled, t: StageTimes) -> np.ndarray:
    """Seconds of every action of ``c``: f, b, w or b+w of its op; a pair costs
    max(compute_F + compute_BW, comm_F + comm_B) (module docstring)."""
    kinds, st = c.op_kind, c.op_stage
    fa, ba, wa = t.f, t.b, t.w
    dur_arr = np.where(kinds == F, fa[st], 0.0) + np.where(kinds == B, ba[st], 0.0) \
        + np.where(kinds == W, wa[st], 0.0) + np.where(kinds == BW, ba[st] + wa[st], 0.0)
    if c.pair_pos.size:
        fs, bs = c.pair_f_stage, c.pair_b_stage
        compute = (fa[fs] - t.f_comm[fs]) + (ba[bs] - t.b_comm[bs] + wa[bs])
        dur_arr[c.pair_pos] = np.maximum(compute, t.f_comm[fs] + t.b_comm[bs])
    return dur_arr


def run_compiled(c: Compiled, dur: list[float], t: StageTimes) -> list[float]:
    """End time of every action of ``c`` (topological order) for durations ``dur``."""
    return _run(c.rank, c.dep1, t.p2p[c.bnd1].tolist(), c.dep2, t.p2p[c.bnd2].tolist(), dur,
                len(c.first_pos))


def _run(rank: list[int], dep1: list[int], lat1: list[float], dep2: list[int],
         lat2: list[float], dur: list[float], p: int) -> list[float]:
    """End time of every action, visiting them in topological order (the hot loop)."""
    end = [0.0] * len(dur)
    free = [0.0] * p
    for q, (r, d1, l1, d2, l2, du) in enumerate(zip(rank, dep1, lat1, dep2, lat2, dur)):
        t = free[r]
        if d1 >= 0:
            x = end[d1] + l1
            if x > t:
                t = x
            if d2 >= 0:
                x = end[d2] + l2
                if x > t:
                    t = x
        t += du
        end[q] = t
        free[r] = t
    return end
