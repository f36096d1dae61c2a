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
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from costmodels.pipeline.schedules import (B, BW, F, KIND_NAMES, W, build_orders, get_spec,
                                           stage_rank)


@dataclass(frozen=True, eq=False)   # identity hash: cached per shape
class Compiled:
    """A schedule's actions in a topological order, as flat lists indexed by position."""

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


def _deadlock_error(schedule: str, orders, ptr) -> RuntimeError:
    heads = [f"rank {r}: {KIND_NAMES[o[ptr[r]][0][0]]}(mb {o[ptr[r]][0][1]}, "
             f"stage {o[ptr[r]][0][2]})" for r, o in enumerate(orders) if ptr[r] < len(o)]
    return RuntimeError(f"pipeline schedule {schedule!r} deadlocks (a bug in its order); "
                        f"blocked heads: {'; '.join(heads[:6])}")


@lru_cache(maxsize=512)  # ~2.5 MB per entry at pp=16, m=128, v=3; most are far smaller
def compile_schedule(schedule: str, p: int, m: int, v: int) -> Compiled:
    spec = get_spec(schedule)
    orders = build_orders(schedule, p, m, v)
    n_stages = p * v
    place = [stage_rank(s, p, spec.placement) for s in range(n_stages)]

    # Number every action; provider[key(kind, mb, stage)] = the action that runs that op
    # (a BW provides both B and W).
    act_rank: list[int] = []
    act_ops: list[tuple[tuple[int, int, int], ...]] = []
    rank_ids: list[list[int]] = []
    provider = [-1] * (3 * n_stages * m)
    for r, acts in enumerate(orders):
        ids = []
        for act in acts:
            a = len(act_ops)
            ids.append(a)
            act_rank.append(r)
            act_ops.append(act)
            for kind, i, s in act:
                if place[s] != r:
                    raise RuntimeError(f"{schedule}: stage {s} scheduled on rank {r}, "
                                       f"placed on rank {place[s]}")
                for k in ((B, W) if kind == BW else (kind,)):
                    key = (k * n_stages + s) * m + i
                    if provider[key] >= 0:
                        raise RuntimeError(f"{schedule}: {KIND_NAMES[k]}(mb {i}, stage {s}) "
                                           f"scheduled twice")
                    provider[key] = a
        rank_ids.append(ids)
    if -1 in provider:
        key = provider.index(-1)
        k, rest = divmod(key, n_stages * m)
        raise RuntimeError(f"{schedule}: {KIND_NAMES[k]}(mb {rest % m}, stage {rest // m}) "
                           f"is never scheduled")

    # Inputs of every action: (providing action, p2p boundary or -1), see module docstring.
    deps: list[list[tuple[int, int]]] = []
    for a, act in enumerate(act_ops):
        d = []
        for kind, i, s in act:
            if kind == F:
                if s == 0:
                    continue
                src, bnd = provider[(F * n_stages + s - 1) * m + i], s - 1
            elif kind == W:
                src, bnd = provider[(B * n_stages + s) * m + i], -1
            elif s == n_stages - 1:
                src, bnd = provider[(F * n_stages + s) * m + i], -1
            else:
                src, bnd = provider[(B * n_stages + s + 1) * m + i], s
            if src != a:
                d.append((src, bnd))
        deps.append(d)

    # Topological order: advance every rank as far as its inputs allow, repeat.  An
    # input later in the same rank's order, or a cycle across ranks, stalls every rank.
    n = len(act_ops)
    pos = [-1] * n
    ptr = [0] * p
    topo: list[int] = []
    while len(topo) < n:
        before = len(topo)
        for r in range(p):
            ids, j = rank_ids[r], ptr[r]
            while j < len(ids):
                a = ids[j]
                if any(pos[src] < 0 for src, _ in deps[a]):
                    break
                pos[a] = len(topo)
                topo.append(a)
                j += 1
            ptr[r] = j
        if len(topo) == before:
            raise _deadlock_error(schedule, orders, ptr)

    rank = [act_rank[a] for a in topo]
    dep1 = [-1] * n
    dep2 = [-1] * n
    bnd1 = [-1] * n
    bnd2 = [-1] * n
    op_kind = [-1] * n
    op_stage = [0] * n
    pairs: list[tuple[int, int, int]] = []
    for q, a in enumerate(topo):
        # Inputs on the same rank ran earlier in its order (the sort checked it), so the
        # rank's own clock already covers them; only remote inputs are kept.
        cross = [(pos[src], bnd) for src, bnd in deps[a] if act_rank[src] != rank[q]]
        if len(cross) > 2:
            raise RuntimeError(f"{schedule}: action with {len(cross)} remote inputs")
        if cross:
            dep1[q], bnd1[q] = cross[0]
            if len(cross) == 2:
                dep2[q], bnd2[q] = cross[1]
        act = act_ops[a]
        if len(act) == 1:
            op_kind[q] = act[0][0]
            op_stage[q] = act[0][2]
        else:
            (fk, _, fs), (bk, _, bs) = act
            if (fk, bk) != (F, BW):
                raise RuntimeError(f"{schedule}: overlapped pair must be (F, BW), got {act}")
            op_stage[q] = fs
            pairs.append((q, fs, bs))

    pair_arr = np.array(pairs, dtype=np.int64).reshape(-1, 3)
    as_array = np.asarray
    return Compiled(rank, dep1, dep2, as_array(bnd1), as_array(bnd2), as_array(op_kind),
                     as_array(op_stage),
                     pair_arr[:, 0], pair_arr[:, 1], pair_arr[:, 2],
                     [pos[ids[0]] for ids in rank_ids], [pos[ids[-1]] for ids in rank_ids],
                     [act_ops[a] for a in topo], _peak_in_flight(orders))


def _peak_in_flight(orders) -> tuple[int, ...]:
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
    q = 0
    for r, d1, l1, d2, l2, du in zip(rank, dep1, lat1, dep2, lat2, dur):
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
        q += 1
    return end
