"""Dependency-driven simulation of a pipeline schedule.

Each rank runs its actions in the order the schedule gives (costmodels.pipeline.schedules).
An action starts when its rank is free and all of its inputs have arrived:

    F(i, s)      after F(i, s−1) ended  + p2p(s−1 → s)        (nothing for s = 0)
    B/BW(i, s)   after B(i, s+1) ended  + p2p(s → s+1)        (F(i, s) for the last stage)
    W(i, s)      after B(i, s) ended (same rank, so no p2p)

p2p between two virtual stages on the same rank is 0 (the turn of the V placement).  The
time of an action is its op's time: f[s], b[s], w[s], or b[s]+w[s] for a fused BW.  An
overlapped pair (DualPipeV) costs max(compute_F + compute_BW, comm_F + comm_B) where
comm_X is the part of the op time given as ``f_comm``/``b_comm`` (e.g. MoE all-to-all) and
compute_X the rest: the two micro-batches' compute shares the SMs and simply adds up;
what the pair buys is that one's communication hides under the other's compute.  With no
communication given, the pair costs exactly f + b + w.  p2p sends are asynchronous: they
delay the receiver, never the sender.

Compilation (orders → dependency arrays in a topological order, deadlock check, peak
in-flight count) depends only on (schedule, pp, m, chunks) and is cached; a call then
does one pass over the actions.  pp=16, m=128, v=3 interleaved (12,288 actions) takes a
few milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np

from costmodels.pipeline.schedules import (B, BW, F, KIND_NAMES, W, build_orders, get_spec,
                                           stage_rank)


class TimelineEntry(NamedTuple):
    """One op on the Gantt chart.  The two ops of an overlapped pair share one interval."""

    rank: int
    kind: str            # "F", "B", "W" or "BW"
    microbatch: int
    virtual_stage: int
    start: float         # seconds from the first op of the step
    end: float


@dataclass(frozen=True)
class PipelineResult:
    """Outcome of simulating one training step of a pipeline schedule.

    Times in seconds.  Definitions (p = ranks, T = step_time, busy_r = compute time of
    rank r, Σ over ranks):

    - ``step_time`` T: first op start to last op end over all ranks (makespan).  What a
      step costs when the optimizer step waits for the whole pipeline (global grad-norm
      clipping, as in Megatron-LM and torchtitan).
    - ``steady_step_time``: max over ranks of (its last end − its first start).  What a
      step costs when consecutive steps overlap across ranks — each rank starts the next
      step as soon as it finished this one (Zero Bubble's optimizer post-validation).
      Equal to ``step_time`` whenever rank 0 both starts first and ends last (GPipe,
      1F1B, interleaved, ZB-H1); smaller for parallelogram schedules (ZB-H2, ZB-V).
    - ``bubble_fraction`` = 1 − Σ busy_r / (p·T): idle share of the ranks' time; 1F1B at
      equal stages gives (p−1)/(m+p−1).
    - ``bubble_ratio`` = (p·T − Σ busy_r) / Σ busy_r: idle per unit of compute; 1F1B gives
      (p−1)/m, the quantity Narayanan et al. (SC'21) call "bubble time fraction".
    - ``bubble_time`` = T − mean(busy_r): idle time of the average rank; 1F1B at equal
      stages gives (p−1)(F+B+W).
    - ``peak_activations[r]``: most forward chunks whose activations are alive on rank r
      at once, in micro-batch × chunk units (one unit = one micro-batch's activations
      of one virtual stage).  An F adds one; the op that finishes that (micro-batch,
      stage)'s backward — BW, or W when the schedule splits B and W — frees it.
      Counting until W is conservative (W keeps only the layer inputs and output grads,
      less than the full activations) and is the convention under which the papers'
      peaks hold (ZB-H1 ≤ 1F1B's p, DualPipeV's PP+1).
    """

    schedule: str
    stages: int
    microbatches: int
    chunks: int
    step_time: float
    steady_step_time: float
    busy: tuple[float, ...]
    peak_activations: tuple[int, ...]
    timeline: tuple[TimelineEntry, ...] | None = None

    @property
    def total_busy(self) -> float:
        return float(sum(self.busy))

    @property
    def bubble_fraction(self) -> float:
        return _idle_share(self.total_busy, self.stages * self.step_time)

    @property
    def steady_bubble_fraction(self) -> float:
        return _idle_share(self.total_busy, self.stages * self.steady_step_time)

    @property
    def bubble_ratio(self) -> float:
        total = self.total_busy
        return (self.stages * self.step_time - total) / total if total > 0 else 0.0

    @property
    def bubble_time(self) -> float:
        return self.step_time - self.total_busy / self.stages

    @property
    def steady_bubble_time(self) -> float:
        return self.steady_step_time - self.total_busy / self.stages


def _idle_share(busy: float, capacity: float) -> float:
    return 1.0 - busy / capacity if capacity > 0 else 0.0


@dataclass(frozen=True)
class _Compiled:
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
def _compile(schedule: str, p: int, m: int, v: int) -> _Compiled:
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
    return _Compiled(rank, dep1, dep2, as_array(bnd1), as_array(bnd2), as_array(op_kind),
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


def _per_stage(name: str, values: Sequence[float] | None, n: int) -> np.ndarray:
    if values is None:
        return np.zeros(n)
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.shape != (n,):
        raise ValueError(f"{name} needs one time per virtual stage (pp·chunks = {n}), "
                         f"got {arr.size}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and >= 0 seconds, got {arr.tolist()}")
    return arr


def _boundaries(p2p: float | Sequence[float], n_stages: int) -> np.ndarray:
    """p2p per boundary s→s+1 (n_stages−1 of them), plus a trailing 0 for 'no boundary'."""
    arr = np.asarray(p2p, dtype=float).reshape(-1)
    if arr.size == 1:
        arr = np.full(max(n_stages - 1, 0), float(arr[0]))
    elif arr.size != n_stages - 1:
        raise ValueError(f"p2p needs a scalar or one time per boundary between virtual "
                         f"stages ({n_stages - 1}), got {arr.size}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"p2p must be finite and >= 0 seconds, got {arr.tolist()}")
    return np.append(arr, 0.0)


def simulate(schedule: str, *, stages: int, microbatches: int, chunks: int = 1,
             f: Sequence[float], b: Sequence[float], w: Sequence[float],
             p2p: float | Sequence[float] = 0.0,
             f_comm: Sequence[float] | None = None, b_comm: Sequence[float] | None = None,
             keep_timeline: bool = False) -> PipelineResult:
    """Simulate one training step of ``schedule`` and return its timing and memory.

    ``stages`` = pp (ranks), ``chunks`` = virtual stages per rank, ``microbatches`` = m.
    ``f``, ``b``, ``w``: per virtual stage (pp·chunks entries, model order), seconds for
    one micro-batch's forward, input-gradient backward and weight-gradient backward.
    ``p2p``: seconds to move one micro-batch's activation (or its gradient) across a
    boundary between consecutive virtual stages; a scalar or one per boundary
    (pp·chunks−1); ignored where both stages share a rank.  ``f_comm``/``b_comm``: the
    part of f / b that is communication an overlapped F&B pair can hide (DualPipeV
    only; see module docstring).  Raises ValueError on bad input and RuntimeError if the
    schedule's order deadlocks (a bug).
    """
    spec = get_spec(schedule)
    spec.check(stages, microbatches, chunks)
    n_stages = stages * chunks
    fa = _per_stage("f", f, n_stages)
    ba = _per_stage("b", b, n_stages)
    wa = _per_stage("w", w, n_stages)
    fc = _per_stage("f_comm", f_comm, n_stages)
    bc = _per_stage("b_comm", b_comm, n_stages)
    if np.any(fc > fa) or np.any(bc > ba):
        raise ValueError("f_comm/b_comm are parts of f/b and cannot exceed them")
    bnd = _boundaries(p2p, n_stages)
    c = _compile(schedule, stages, microbatches, chunks)

    kinds, st = c.op_kind, c.op_stage
    dur_arr = np.where(kinds == F, fa[st], 0.0) + np.where(kinds == B, ba[st], 0.0) \
        + np.where(kinds == W, wa[st], 0.0) + np.where(kinds == BW, ba[st] + wa[st], 0.0)
    if c.pair_pos.size:
        fs, bs = c.pair_f_stage, c.pair_b_stage
        compute = (fa[fs] - fc[fs]) + (ba[bs] - bc[bs] + wa[bs])
        dur_arr[c.pair_pos] = np.maximum(compute, fc[fs] + bc[bs])
    dur = dur_arr.tolist()
    lat1 = bnd[c.bnd1].tolist()
    lat2 = bnd[c.bnd2].tolist()

    end = _run(c.rank, c.dep1, lat1, c.dep2, lat2, dur, stages)

    busy = np.bincount(np.asarray(c.rank), weights=dur_arr, minlength=stages)
    starts = [end[q] - dur[q] for q in c.first_pos]
    ends = [end[q] for q in c.last_pos]
    t0 = min(starts)
    step = max(ends) - t0
    steady = max(e - s for s, e in zip(starts, ends))

    timeline = None
    if keep_timeline:
        # Per rank in execution order (the topological order keeps each rank's order).
        by_rank: list[list[TimelineEntry]] = [[] for _ in range(stages)]
        for q, act in enumerate(c.ops):
            for kind, i, s in act:
                by_rank[c.rank[q]].append(TimelineEntry(c.rank[q], KIND_NAMES[kind], i, s,
                                                        end[q] - dur[q] - t0, end[q] - t0))
        timeline = tuple(e for rows in by_rank for e in rows)
    return PipelineResult(schedule, stages, microbatches, chunks, float(step), float(steady),
                          tuple(float(x) for x in busy), c.peak, timeline)


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
