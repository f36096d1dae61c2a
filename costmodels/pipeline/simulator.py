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
in-flight count; costmodels.pipeline.events) depends only on (schedule, pp, m, chunks) and
is cached; a call then does one pass over the actions.  A long step is not simulated in
full: costmodels.pipeline.steady simulates a short one (about pp to 4·pp micro-batches)
and inserts the missing steady-state periods through one period's max-plus matrix —
exact, and its cost does not grow with m.  ``simulate(..., exact=True)`` runs every action:
the reference path the extrapolation is tested against.  ``simulate_many`` prices one shape
under many stage times (a band's samples) at once (costmodels.pipeline.paired), each result
the one ``simulate`` gives.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from costmodels.pipeline import paired, steady
from costmodels.pipeline.events import StageTimes, durations, run_compiled
from costmodels.pipeline.events import compile_schedule as _compile
from costmodels.pipeline.schedules import KIND_NAMES, get_spec


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
             keep_timeline: bool = False, exact: bool = False) -> PipelineResult:
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

    Without a timeline, a long step is priced from a shorter one plus whole steady-state
    periods (costmodels.pipeline.steady: exact, cost independent of m); ``exact=True``
    forces the event-by-event simulation of all m micro-batches (the reference path).
    """
    get_spec(schedule).check(stages, microbatches, chunks)
    times = _stage_times(stages * chunks, f, b, w, p2p, f_comm, b_comm)
    if not (keep_timeline or exact):
        fast = steady.extrapolate(schedule, stages, microbatches, chunks, times)
        if fast is not None:
            step, steady_step, busy, peak = fast
            return PipelineResult(schedule, stages, microbatches, chunks, step, steady_step,
                                  busy, peak)
    return _simulated(schedule, stages, microbatches, chunks, times, keep_timeline)


def simulate_many(schedule: str, *, stages: int, microbatches: int, chunks: int = 1,
                  runs: Sequence[dict[str, Any]], exact: bool = False) -> list[PipelineResult]:
    """``simulate(schedule, stages=…, microbatches=…, chunks=…, exact=exact, **run)`` for every
    ``run`` (its f, b, w, p2p, f_comm, b_comm), equal to the bit: one shape under many stage times
    (a band's paired samples) extrapolated at once where it extrapolates, else simulated whole at
    once (``costmodels.pipeline.paired``); with ``exact``, each run on its own."""
    get_spec(schedule).check(stages, microbatches, chunks)
    times = [_stage_times(stages * chunks, r["f"], r["b"], r["w"], r.get("p2p", 0.0), r.get("f_comm"),
                          r.get("b_comm")) for r in runs]
    batched = not exact and len(runs) > 1
    fast = paired.extrapolate_many(schedule, stages, microbatches, chunks, times) if batched else [None] * len(runs)
    if batched and fast[0] is None:
        fast = paired.simulate_all(schedule, stages, microbatches, chunks, times)
    return [PipelineResult(schedule, stages, microbatches, chunks, *x) if x is not None
            else simulate(schedule, stages=stages, microbatches=microbatches, chunks=chunks, exact=exact, **r)
            for x, r in zip(fast, runs)]


def _stage_times(n_stages: int, f: Sequence[float], b: Sequence[float], w: Sequence[float],
                 p2p: float | Sequence[float], f_comm: Sequence[float] | None,
                 b_comm: Sequence[float] | None) -> StageTimes:
    """The checked ``StageTimes`` of ``simulate``'s arguments (ValueError on bad input)."""
    fa = _per_stage("f", f, n_stages)
    ba = _per_stage("b", b, n_stages)
    wa = _per_stage("w", w, n_stages)
    fc = _per_stage("f_comm", f_comm, n_stages)
    bc = _per_stage("b_comm", b_comm, n_stages)
    if np.any(fc > fa) or np.any(bc > ba):
        raise ValueError("f_comm/b_comm are parts of f/b and cannot exceed them")
    return StageTimes(fa, ba, wa, fc, bc, _boundaries(p2p, n_stages))


def _simulated(schedule: str, stages: int, microbatches: int, chunks: int, times: StageTimes,
               keep_timeline: bool) -> PipelineResult:
    """The event-by-event simulation of the whole step."""
    c = _compile(schedule, stages, microbatches, chunks)
    dur_arr = durations(c, times)
    dur = dur_arr.tolist()
    end = run_compiled(c, dur, times)

    busy = np.bincount(np.asarray(c.rank), weights=dur_arr, minlength=stages)
    starts = [end[q] - dur[q] for q in c.first_pos]
    ends = [end[q] for q in c.last_pos]
    t0 = min(starts)
    step = max(ends) - t0
    steady_step = max(e - s for s, e in zip(starts, ends))

    timeline = None
    if keep_timeline:
        # Per rank in execution order (the topological order keeps each rank's order).
        by_rank: list[list[TimelineEntry]] = [[] for _ in range(stages)]
        for q, act in enumerate(c.ops):
            for kind, i, s in act:
                by_rank[c.rank[q]].append(TimelineEntry(c.rank[q], KIND_NAMES[kind], i, s,
                                                        end[q] - dur[q] - t0, end[q] - t0))
        timeline = tuple(e for rows in by_rank for e in rows)
    return PipelineResult(schedule, stages, microbatches, chunks, float(step), float(steady_step),
                          tuple(float(x) for x in busy), c.peak, timeline)


