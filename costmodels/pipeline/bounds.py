"""What a pipeline step costs at least, and what it holds in flight, without simulating it.

``peak_activations(schedule, p, m, v)`` is ``PipelineResult.peak_activations`` — a property
of the order alone (no durations): from the shortest periodic step ``steady.reduced_sizes``
finds when there is one (the live count is periodic: the value the extrapolated simulation
returns; tests/costmodels/test_pipeline_bounds.py checks it against the full simulation),
else from the order of all m micro-batches.

``makespan_lower_bound`` is a lower bound on the simulated makespan for any durations, from
three facts of the dependency rules (simulator module docstring; N = p·v virtual stages,
lat_s = the p2p of boundary s → s+1 when the two stages sit on different ranks, else 0):

* rank r cannot start before micro-batch 0's forward reaches its first stage s_r:
  head_r = Σ_{s<s_r} (f_s + lat_s);
* no backward op of stage s can start before one micro-batch's forward ran through every
  stage and its backward down to s+1: E_s = Σ_s' f_s' + Σ_{s'<N−1} lat_s' + Σ_{s'>s} (b_s' +
  lat_s'); before its first backward a rank runs only forwards, and at most
  ``peak_activations[r]`` of them (nothing is freed before a backward), so at most
  peak_r · max f of its stages of work;
* where the backward is not split (``split_backward`` false: every backward is one BW op), a
  rank's last action is a BW of its first stage s_r (any later stage's chain would come back
  to the rank), after which the BWs of stages s_r−1 … 0 still run:
  tail_r = Σ_{s<s_r} (b_s + w_s + lat_s); 0 otherwise (a W can end a rank).

Every action of a rank runs back to back at best, so, with busy_r = m · Σ_{s on r} (f + b +
w), makespan ≥ max_r max(head_r + busy_r, min_{s on r} E_s + busy_r − min(peak_r · max f,
m · Σ f)) + tail_r.  The makespan is max-plus in the durations, so longer backwards
(recomputation) only raise it: the bound at the shortest durations holds for them too.
Overlapped pairs (DualPipeV) cost max(compute_F + compute_BW, comm_F + comm_B) ≥ their ops'
sum less the communication given (``f_comm``, ``b_comm``: what a pair can hide), so there
every op is priced at its compute share, f' = f − f_comm and b' = b − b_comm, and only the
first fact and the busy time are used: makespan ≥ max_r (head'_r + m · Σ_{s on r} (f' + b' + w))
(every action of rank r waits for some micro-batch's forwards through the stages before its
first, each of which ends at least f' after it starts, alone or in a pair).  The bound sums
in another order than the simulation, so callers leave a relative margin (1e-9).

``steady_lower_bound`` bounds ``steady_step_time`` (the longest rank span, what a step costs
under optimizer post-validation): a rank's span holds all its actions, so it is at least its
busy time, m · Σ_{s on r} (f' + b' + w) with the compute shares f', b' above (f' = f, b' = b
outside overlapped pairs).
"""
from __future__ import annotations

from collections.abc import Sequence

from costmodels.memo import memo
from costmodels.pipeline import steady
from costmodels.pipeline.events import _peak_in_flight, compile_schedule
from costmodels.pipeline.schedules import get_spec, shared_orders, stage_rank


@memo(1024, shared=True)
def peak_activations(schedule: str, p: int, m: int, v: int = 1) -> tuple[int, ...]:
    """Per-rank peak live forward chunks of the schedule's order (module docstring)."""
    get_spec(schedule).check(p, m, v)
    for m_s in steady.reduced_sizes(schedule, p, m, v):
        return compile_schedule(schedule, p, m_s, v).peak
    return _peak_in_flight(shared_orders(schedule, p, m, v))


def makespan_lower_bound(schedule: str, p: int, m: int, v: int, f: Sequence[float],
                         b: Sequence[float], w: Sequence[float], p2p: float,
                         f_comm: Sequence[float] | None = None, b_comm: Sequence[float] | None = None) -> float:
    """A lower bound on ``simulate(schedule, ...).step_time`` (module docstring), seconds;
    ``f_comm``/``b_comm`` as ``simulate`` takes them (read by overlapped pairs only)."""
    spec = get_spec(schedule)
    if spec.overlapped_pairs:
        return _paired_lower_bound(schedule, p, m, v, f, b, w, p2p, f_comm, b_comm)
    n = p * v
    crosses, stages_of = _placement(schedule, p, v)
    lat = [p2p if x else 0.0 for x in crosses]
    head = [0.0]                                   # head[s] = Σ_{s'<s} (f + lat)
    tail = [0.0]                                   # tail[s] = Σ_{s'<s} (b + w + lat)
    for s in range(n):
        head.append(head[-1] + f[s] + lat[s])
        tail.append(tail[-1] + b[s] + w[s] + lat[s])
    earliest = [0.0] * n                           # E_s
    earliest[n - 1] = head[n - 1] + f[n - 1]
    for s in range(n - 2, -1, -1):
        earliest[s] = earliest[s + 1] + b[s + 1] + lat[s]
    peaks = peak_activations(schedule, p, m, v)
    best = 0.0
    for r, own in enumerate(stages_of):
        first = own[0]
        busy = m * sum(f[s] + b[s] + w[s] for s in own)
        forwards = min(peaks[r] * max(f[s] for s in own), m * sum(f[s] for s in own))
        bound = max(head[first] + busy, min(earliest[s] for s in own) + busy - forwards)
        if not spec.split_backward:
            bound += tail[first]
        best = max(best, bound)
    return best


def steady_lower_bound(schedule: str, p: int, m: int, v: int, f: Sequence[float], b: Sequence[float],
                       w: Sequence[float], f_comm: Sequence[float] | None = None,
                       b_comm: Sequence[float] | None = None) -> float:
    """A lower bound on ``simulate(schedule, ...).steady_step_time`` (module docstring), seconds."""
    n = p * v
    paired = get_spec(schedule).overlapped_pairs
    fc = f_comm if paired and f_comm is not None else [0.0] * n
    bc = b_comm if paired and b_comm is not None else [0.0] * n
    _, stages_of = _placement(schedule, p, v)
    return max(m * sum((f[s] - fc[s]) + (b[s] - bc[s]) + w[s] for s in own) for own in stages_of)


def _paired_lower_bound(schedule: str, p: int, m: int, v: int, f: Sequence[float], b: Sequence[float],
                        w: Sequence[float], p2p: float, f_comm: Sequence[float] | None,
                        b_comm: Sequence[float] | None) -> float:
    """max_r (head'_r + m · Σ_{s on r} (f' + b' + w)) of the module docstring (overlapped pairs)."""
    n = p * v
    fc = f_comm if f_comm is not None else [0.0] * n
    bc = b_comm if b_comm is not None else [0.0] * n
    crosses, stages_of = _placement(schedule, p, v)
    head = [0.0]                                   # head[s] = Σ_{s'<s} (f' + lat)
    for s in range(n):
        head.append(head[-1] + (f[s] - fc[s]) + (p2p if crosses[s] else 0.0))
    return max(head[own[0]] + m * sum((f[s] - fc[s]) + (b[s] - bc[s]) + w[s] for s in own) for own in stages_of)


@memo(1024)
def _placement(schedule: str, p: int, v: int) -> tuple[tuple[bool, ...], tuple[tuple[int, ...], ...]]:
    """(whether boundary s → s+1 joins two ranks, per virtual stage; each rank's stages)."""
    n = p * v
    rank = [stage_rank(s, p, get_spec(schedule).placement) for s in range(n)]
    stages_of: list[list[int]] = [[] for _ in range(p)]
    for s in range(n):
        stages_of[rank[s]].append(s)
    return (tuple(s + 1 < n and rank[s] != rank[s + 1] for s in range(n)),
            tuple(tuple(own) for own in stages_of))
