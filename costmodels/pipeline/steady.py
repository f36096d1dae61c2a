"""A long pipeline step priced from a short one: exact steady-state extrapolation.

Every schedule here (GPipe aside) is, away from its warm-up and cool-down, *periodic*:
with c micro-batches per period (c = 1; the group size g for Megatron interleaved), the
order for m + c micro-batches is the order for m with one more steady period, and an op
(kind, i, s) of the steady state has the same kind of inputs as (kind, i + c, s), shifted
by c (σ: i → i + c).  Key every action by the micro-batch of its first op; for a split S
let the *past* C_S = the actions keyed below S and everything they wait for, directly or
not (down-closed: a 1F1B backward follows a later micro-batch's forward on its rank), and
the *frontier* F_S = the actions of C_S that some action outside it waits for.  Every end
time outside C_S is a max-plus function of the frontier's end times.  If σ maps F_S onto
F_{S+c} and the period C_{S+c} − C_S onto the next one, one period is a max-plus matrix A:

    end(σ F_S) = A ⊗ end(F_S),   (A ⊗ x)_i = max_j (A_ij + x_j)

and a step of m micro-batches is a simulated step of m_s ≡ m (mod c) micro-batches with
J = (m − m_s) / c periods inserted before its tail (the actions outside C_T, T = S + c):
the head is the short step's, the frontier after the inserted periods is A^J ⊗ end(F_T),
and the tail is re-run from it.  Each rank's busy time grows by J times its busy time over
one period; peak activations are the m_s step's (the live count is periodic).

A^J ⊗ x costs J matrix-vector products of frontier size (~2 pp), and fewer: as soon as an
iterate equals an earlier one plus a constant (to REL_TOL), the steady state has set in
(A is homogeneous: adding a constant to x adds it to A ⊗ x) and the rest is that cycle
repeated.  Uneven stages can keep a transient alive for hundreds of micro-batches (a
lighter first stage's slack drains one rank at a time); the iteration is exact through it.
A is built from the period's actions, so floating-point sums run in another order than the
event-by-event simulation: results agree to ~1e-13 relative.

The structure — σ well defined on F_S and the period, its images' inputs the shifted
inputs, σ F_S = F_{S+c}, every rank's last action in the tail — is checked on the compiled
m_s order; that the m order is the m_s order with inserted periods is a property of the
generators in schedules.py, tested against the full simulation for every schedule, pp,
chunks and m (tests/costmodels/test_pipeline.py).  Cost: one pass over the m_s step's past
C_T (the m_s step is the shortest with a split: ~pp micro-batches for 1F1B, up to 4·pp for
interleaved), the period's matrix and one pass over the tail, independent of m.  The cycle
tolerance's scale, the m_s step's largest end, is bracketed by C_T's largest end and a
level-wise bound on the tail's (``_tail_bound``); the m_s step's tail is simulated for it
only where some comparison falls between the two tolerances (``_advance``).  Where J is so
small that building A costs more (``_pays_off``), the J periods are run one by one on the m_s
step's order instead (``_run_periods``): the event-by-event simulation's floats, at no more
than the matrix's cost, and still no order of all m micro-batches to compile.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from costmodels.memo import memo
from costmodels.pipeline.events import (
    Compiled,
    StageTimes,
    compile_schedule,
    durations,
    rank_predecessors,
    run_compiled,
)
from costmodels.pipeline.schedules import get_spec, interleaved_group_size

REL_TOL = 1e-12       # iterates repeat to this share of the step's largest end time

Summary = tuple[float, float, tuple[float, ...], tuple[int, ...]]
"""(step time, steady step time, busy seconds per rank, peak activations per rank)."""


@dataclass(frozen=True, eq=False)
class Period:
    """Where the compiled m_s step is split (module docstring).  Equal (and hashed) by
    ``shape``, what it was found for: memos of it key on that value."""

    split: int                  # T = S + c
    frontier: np.ndarray        # positions of F_S
    image: np.ndarray           # positions of σ F_S (same order)
    period: np.ndarray          # positions of C_T minus C_S: one period
    reach: np.ndarray           # _Graph.reach: actions with reach >= T are the tail
    prev: list[int]             # rank predecessor of every action (−1: none)
    tail_size: int              # actions with reach >= T
    shape: tuple[str, int, int, int, int]   # (schedule, pp, m_s, chunks, c): find_period's arguments

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Period) and self.shape == other.shape

    def __hash__(self) -> int:
        return hash(self.shape)


def period_microbatches(schedule: str, p: int, m: int) -> int | None:
    """c, or None where the step is not one periodic steady state (GPipe runs all
    forwards, then all backwards: two)."""
    if schedule == "gpipe":
        return None
    return interleaved_group_size(p, m) if schedule == "interleaved" else 1


# Where the search for the shortest qualifying m_s starts (micro-batches, pp = p, period c):
# warm-up, one period and the cool-down; find_period's minimum for pp = 2..32 is at most
# one more than this for 1F1B/ZB-H1, and equal for the others.
_FIRST = {"1f1b": lambda p, c: p + 2, "zb-h1": lambda p, c: p + 2,
          "zbv": lambda p, c: 2 * p + 2, "dualpipev": lambda p, c: 2 * p + 3,
          "zb-h2": lambda p, c: 3 * p, "interleaved": lambda p, c: 4 * c}


def reduced_sizes(schedule: str, p: int, m: int, v: int) -> list[int]:
    """The m_s to simulate: the shortest step ≡ m (mod c) whose compiled order has a split
    (``short_size``), if shorter than m.  Every m of a (schedule, pp, chunks) shares the
    compiled order of one m_s per residue mod c."""
    c = period_microbatches(schedule, p, m)
    if c is None or p == 1:     # one rank: the step is the sum of its ops, already cheap
        return []
    m_s = short_size(schedule, p, v, c, m % c)
    return [m_s] if m_s is not None and m_s < m else []


@memo(256)
def short_size(schedule: str, p: int, v: int, c: int, residue: int) -> int | None:
    """Smallest m_s ≡ residue (mod c), from _FIRST on (at most 4 periods more), for which
    ``find_period`` finds a split (and, interleaved, the group size is still c)."""
    first = max(_FIRST[schedule](p, c), get_spec(schedule).min_microbatches(p))
    first += (residue - first) % c
    for m_s in range(first, first + 4 * c + 1, c):
        if schedule == "interleaved" and interleaved_group_size(p, m_s) != c:
            continue
        if find_period(schedule, p, m_s, v, c) is not None:
            return m_s
    return None


@memo(256, shared=True)
def find_period(schedule: str, p: int, m_s: int, v: int, c: int) -> Period | None:
    """The latest split S of the compiled m_s step whose structure satisfies the module
    docstring's conditions for a period of c micro-batches, or None.  Every rank's last
    action must lie in the tail: the inserted periods come before it."""
    g = _graph(schedule, p, m_s, v)
    valid = _shift_map(g, c)
    last = g.reach[compile_schedule(schedule, p, m_s, v).last_pos]
    for s_split in range(min(m_s - 2 * c, int(last.min()) - c), 0, -1):
        front = np.flatnonzero((g.reach < s_split) & (g.succ_reach >= s_split))
        period = np.flatnonzero((g.reach >= s_split) & (g.reach < s_split + c))
        if not (valid[front] >= 0).all() or not (valid[period] >= 0).all():
            continue
        nxt = np.flatnonzero((g.reach < s_split + c) & (g.succ_reach >= s_split + c))
        image = valid[front]
        if np.array_equal(np.sort(image), nxt):
            return Period(s_split + c, front, image, period, g.reach, g.preds[:, 0].tolist(),
                          int(np.count_nonzero(g.reach >= s_split + c)), (schedule, p, m_s, v, c))
    return None


@dataclass(frozen=True)
class _Graph:
    """The compiled m_s step as arrays: per action its ops' (kind, micro-batch, stage) (the
    second op −1 for single ops), its rank predecessor and remote inputs (−1: none), and
    ``where`` the action running op (kind, stage, micro-batch).  ``reach[x]``: the least key
    of x and every action that waits for it, directly or not — so {x : reach < S} is the
    down-closed past C_S of the module docstring (a 1F1B backward waits on a forward of a
    later micro-batch: keys alone are not down-closed); ``succ_reach[x]``: the largest reach
    among the actions waiting for x (−1: none), so x is on the frontier of C_S when
    reach[x] < S <= succ_reach[x]."""

    ops: np.ndarray          # (n, 2, 3)
    preds: np.ndarray        # (n, 3): rank predecessor, remote input 1, remote input 2
    reach: np.ndarray
    succ_reach: np.ndarray
    where: np.ndarray        # (4, stages, m)


@memo(64)
def _graph(schedule: str, p: int, m_s: int, v: int) -> _Graph:
    comp = compile_schedule(schedule, p, m_s, v)
    n = len(comp.ops)
    ops = comp.op_table
    prev = rank_predecessors(comp).tolist()
    reach = ops[:, 0, 1].tolist()
    for q, a, b, c in zip(range(n - 1, -1, -1), reversed(prev), reversed(comp.dep1), reversed(comp.dep2)):
        rq = reach[q]                    # successors sit later in the topological order
        if a >= 0 and rq < reach[a]:
            reach[a] = rq
        if b >= 0 and rq < reach[b]:
            reach[b] = rq
        if c >= 0 and rq < reach[c]:
            reach[c] = rq
    preds = np.array([prev, comp.dep1, comp.dep2], dtype=np.int64).T
    reach_arr = np.array(reach, dtype=np.int64)
    succ_reach = np.full(n, -1, dtype=np.int64)
    for col in preds.T:
        has = col >= 0
        np.maximum.at(succ_reach, col[has], reach_arr[has])
    where = np.full((4, p * v, m_s), -1)
    for j in range(2):
        single = ops[:, j, 0] >= 0
        where[ops[single, j, 0], ops[single, j, 2], ops[single, j, 1]] = np.flatnonzero(single)
    return _Graph(ops, preds, reach_arr, succ_reach, where)


def _shift_map(g: _Graph, c: int) -> np.ndarray:
    """σ on action positions: the action running every op of q shifted by c micro-batches,
    or −1 where there is none, it runs other ops too, or its inputs (the rank predecessor
    included) are not q's inputs shifted."""
    m = g.where.shape[2]

    def shifted(j: int) -> np.ndarray:
        kind, mb, stage = g.ops[:, j, 0], g.ops[:, j, 1] + c, g.ops[:, j, 2]
        ok = (kind >= 0) & (mb < m)
        out = np.full(len(kind), -2 if j else -1)     # a missing second op: −2, see below
        out[ok] = g.where[kind[ok], stage[ok], mb[ok]]
        out[(kind >= 0) & ~ok] = -1
        return out

    first, second = shifted(0), shifted(1)
    single = g.ops[:, 1, 0] < 0
    sigma = np.where(single | (second == first), first, -1)
    sigma[sigma >= 0] = np.where((g.ops[sigma[sigma >= 0], 1, 0] < 0) == single[sigma >= 0],
                                 sigma[sigma >= 0], -1)
    mapped = np.where(g.preds >= 0, sigma[g.preds], -1)
    ok = sigma >= 0
    ok &= ((g.preds < 0) | (mapped >= 0)).all(axis=1)
    target = g.preds[np.maximum(sigma, 0)]
    ok &= mapped[:, 0] == target[:, 0]
    ok &= (((mapped[:, 1] == target[:, 1]) & (mapped[:, 2] == target[:, 2]))
           | ((mapped[:, 1] == target[:, 2]) & (mapped[:, 2] == target[:, 1])))
    return np.where(ok, sigma, -1)


def extrapolate(schedule: str, p: int, m: int, v: int, times: StageTimes, *,
                always: bool = False) -> Summary | None:
    """(step_time, steady_step_time, busy, peak_activations) of an m step from a shorter
    simulated one, or None where no m_s qualifies.

    The frontier's end times after J = (m − m_s) / c more periods are A^J ⊗ (its times in
    the short step), A the max-plus matrix of one period (``_period_matrix``); applied J
    times, or fewer once the iterates repeat (``_advance``).  Where the matrix would not pay
    off (``_pays_off``; unless ``always``), the J periods are run one by one instead, on the
    short step's compiled order (``_run_periods``): the event-by-event simulation's sums in its
    order, with no order of all m micro-batches to compile.  The tail is then re-run from that
    frontier (``_run_part``)."""
    c = period_microbatches(schedule, p, m)
    for m_s in reduced_sizes(schedule, p, m, v):
        assert c is not None                            # reduced_sizes is empty where c is None
        per = find_period(schedule, p, m_s, v, c)
        if per is None:
            return None
        comp = compile_schedule(schedule, p, m_s, v)
        if _period_rows(comp, per) is None:             # an input out of reach: the full simulation
            return None
        dur_arr = durations(comp, times)
        periods = (m - m_s) // c
        head, tail, rank = _parts(comp, per)
        end = ends_list(len(dur_arr))
        image = per.image.tolist()
        _run_part(head, dur_arr, end, times)            # the short step's past C_T
        matrix_path = always or _pays_off(per, m, m_s, c)
        if not matrix_path:
            x = _run_periods(per, period_part(comp, per), dur_arr, end, times, periods)
        else:
            matrix = _period_matrix(comp, per, dur_arr, times)
            assert matrix is not None                       # _period_rows was not None above
            known = max(end)                                # ≤ the short step's largest end ≤ ``upper``
            ahead = _advance(matrix, np.array([end[q] for q in image]), periods, known,
                             upper=_tail_bound(tail, dur_arr, times, known))
            if ahead is None:                               # the exact scale decides: the short step's tail
                _run_part(tail, dur_arr, end, times)
                ahead = _advance(matrix, np.array([end[q] for q in image]), periods, max(end))
            assert ahead is not None                        # without ``upper`` it always decides
            x = ahead.tolist()
        for q, value in zip(image, x):
            end[q] = value
        _run_part(tail, dur_arr, end, times)
        return summary(comp, per, rank, dur_arr, end, periods, p, in_order=not matrix_path)
    return None


def _run_periods(per: Period, part: _Part, dur_arr: np.ndarray, end: list[float], times: StageTimes,
                 periods: int) -> list[float]:
    """The frontier's end times after ``periods`` more periods, one at a time: the frontier F_S
    takes the times of its images σ F_S, then the period's actions run again (their inputs lie
    in F_S and the period), so its images hold the next period's; ``end`` (the short step's
    past C_T) is left as it was."""
    work = list(end)
    front, image = per.frontier.tolist(), per.image.tolist()
    for _ in range(periods):
        x = [work[q] for q in image]
        for q, value in zip(front, x):
            work[q] = value
        _run_part(part, dur_arr, work, times)
    return [work[q] for q in image]


@memo(256)
def period_part(comp: Compiled, per: Period) -> _Part:
    """The ``_Part`` of one period's actions (C_T − C_S)."""
    return part_of(comp, np.asarray(per.prev), per.period)


def summary(comp: Compiled, per: Period, rank: np.ndarray, dur_arr: np.ndarray, end: Sequence[float] | np.ndarray,
            periods: int, p: int, in_order: bool = False) -> Summary:
    """(step, steady step, busy per rank, peak) of an extrapolated run: ``end`` holds every
    action's end time with the ``periods`` skipped periods applied.  ``in_order``: each rank's
    busy time summed action by action in its order (the past C_T, the inserted periods, the
    tail: a rank's actions in each come after the ones before, C_T being down-closed), as the
    event-by-event simulation sums it, rather than periods × one period's."""
    if in_order:
        head, tail, _ = _parts(comp, per)
        order = np.concatenate([head.at, np.tile(per.period, periods), tail.at])
        busy = np.bincount(rank[order], weights=dur_arr[order], minlength=p)
    else:
        busy = np.bincount(rank, weights=dur_arr, minlength=p) + periods * np.bincount(
            rank[per.period], weights=dur_arr[per.period], minlength=p)
    starts = [end[q] - dur_arr[q] for q in comp.first_pos]
    ends = [end[q] for q in comp.last_pos]
    step = max(ends) - min(starts)
    steady_step = max(e - s for s, e in zip(starts, ends))
    return float(step), float(steady_step), tuple(float(x) for x in busy), comp.peak


def _pays_off(per: Period, m: int, m_s: int, c: int) -> bool:
    """Whether the J = (m − m_s)/c inserted periods are worth A, in units of one
    event-simulated action: building A costs ~16 a period action (numpy on frontier-long
    rows), re-running the tail its length, fixed overheads ~1,000 (measured on pp = 8..32,
    every schedule).  Running the J periods one by one instead (``_run_periods``, on the short
    step's compiled order) costs J·|P|: so J·|P| against 16·|P| + |tail| + 1000."""
    size, periods = len(per.period), (m - m_s) // c
    return periods * size > 16 * size + per.tail_size + 1000


def _simulate(schedule: str, p: int, m: int, v: int, times: StageTimes) -> tuple[Compiled, np.ndarray, np.ndarray]:
    """(compiled order, durations, end times) of the whole m step (tests compare against it)."""
    comp = compile_schedule(schedule, p, m, v)
    dur_arr = durations(comp, times)
    return comp, dur_arr, np.asarray(run_compiled(comp, dur_arr.tolist(), times))


def _period_matrix(comp: Compiled, per: Period, dur_arr: np.ndarray, times: StageTimes) -> np.ndarray | None:
    """A with end(σ F_S[i]) = max_j (A[i, j] + end(F_S[j])): each action of one period as a
    max-plus form in the frontier's end times (one row each, after the frontier's unit rows
    and an all −inf row for a missing input), in topological order; None if an input lies
    outside F_S and the period (the structure check missed something).

    The forms are built a level at a time (``_period_rows``: the actions whose inputs all
    lie in earlier levels), each row by the same max and sums as one at a time."""
    rows = _period_rows(comp, per)
    if rows is None:
        return None
    n, k = len(per.frontier), len(per.period)
    forms = np.empty((n + k + 1, n))            # the period's rows are all written, level by level
    forms[:n] = -np.inf
    forms[np.arange(n), np.arange(n)] = 0.0
    forms[n + k] = -np.inf
    q = per.period
    lat = np.stack([np.zeros(k), times.p2p[comp.bnd1[q]], times.p2p[comp.bnd2[q]]])[:, :, None]
    du = dur_arr[q][:, None]
    for at, inputs in rows[2]:        # max(pred, in1 + lat1, in2 + lat2) + du, the three at once (pred + 0.0 is pred)
        forms[at + n] = (forms[inputs] + lat[:, at]).max(axis=0) + du[at]
    return forms[rows[1]]


_PeriodRows = tuple[list[tuple[int, ...]], list[int], tuple[tuple[np.ndarray, np.ndarray], ...]]
"""``_period_rows``: (input rows per period action, rows of σ F_S, levels (positions, input rows))."""


@memo(256)
def _period_rows(comp: Compiled, per: Period) -> _PeriodRows | None:
    """For ``_period_matrix``: per period action the rows of its rank predecessor and remote
    inputs (−1: the −inf row), the rows of σ F_S, and the period's levels — (positions in the
    period, their three input rows) — where an action's level is one more than its inputs'
    highest (frontier rows: 0); None if an input is out of reach."""
    n = len(per.frontier)
    row = {int(x): j for j, x in enumerate(per.frontier)}
    row.update({int(q): n + i for i, q in enumerate(per.period)})
    inputs: list[tuple[int, ...]] = []
    for q in per.period.tolist():
        got: list[int] = []
        for x in (per.prev[q], comp.dep1[q], comp.dep2[q]):
            if x >= 0 and x not in row:
                return None
            got.append(row[x] if x >= 0 else -1)
        inputs.append(tuple(got))
    image = [row.get(int(y)) for y in per.image]
    if None in image:
        return None
    level = [0] * n
    for rows in inputs:
        level.append(1 + max(level[r] if r >= n else 0 for r in rows))
    by_level: dict[int, list[int]] = {}
    for i in range(len(inputs)):
        by_level.setdefault(level[n + i], []).append(i)
    table = np.array(inputs, dtype=np.int64).reshape(-1, 3)
    levels = tuple((np.array(at), table[at].T.copy()) for _, at in sorted(by_level.items()))
    return inputs, cast("list[int]", image), levels     # no None in image: returned above


def _advance(matrix: np.ndarray, x: np.ndarray, periods: int, scale: float,
             upper: float | None = None) -> np.ndarray | None:
    """A^periods ⊗ x.  Once an iterate equals one of the last 2·len(x) + 2 plus one constant
    (to REL_TOL of ``scale``), the iterates repeat with that cycle: jump to the end.

    With ``upper``, the scale is only known to lie in [scale, upper]: the answer is the one
    every scale in that range gives, or None where some comparison on the way falls between
    the two tolerances (then the caller needs the exact scale).

    The iterates are computed a batch at a time (4, 8, … up to ``BATCH``), then searched for
    the first that matches (``_first_cycle``), so the answer is the one checking after every
    product gives (a product: ``_max_plus``)."""
    n = len(x)
    hist = np.empty((periods + 1, n))
    hist[0] = x
    probe = np.unique(np.linspace(0, n - 1, PROBES).astype(np.int64))
    tol = REL_TOL * max(scale, 1e-300)
    high = tol if upper is None else REL_TOL * max(upper, scale, 1e-300)
    product = _max_plus(matrix)
    done, batch = 0, 4
    while done < periods:
        stop = min(periods, done + batch)
        for j in range(done + 1, stop + 1):
            hist[j] = product(hist[j - 1])
        hit = _first_cycle(hist, probe, done + 1, stop, 2 * n + 2, tol, high)
        if hit is not None:
            if hit == _UNDECIDED:
                return None
            i, j, gap = hit
            q, r = divmod(periods - i, j - i)
            jumped: np.ndarray = hist[i + r] + q * gap       # numpy types a row of hist as Any
            return jumped
        done, batch = stop, min(2 * batch, BATCH)
    last: np.ndarray = hist[periods].copy()
    return last


BATCH = 64          # most iterates computed before they are searched for a cycle
SPARSE_SHARE = 0.5  # A ⊗ x over A's finite entries only when at most this share of A is finite


def _max_plus(matrix: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """x ↦ A ⊗ x.  A period's matrix is mostly −inf (a frontier action reaches only some of the
    next frontier: ~30 % finite for 1F1B and ZB-V at pp = 16..128), so where at most
    ``SPARSE_SHARE`` is finite the product takes each row's max over its finite entries only
    (``np.maximum.reduceat`` over them, row-major): the same sums, and −inf + x is never a
    row's max, so the same floats as the dense product, which reduces A's transpose over its
    rows (the same sums and maxima as max over each row of A + x)."""
    finite = np.isfinite(matrix)
    nonempty = finite.any(axis=1)
    if finite.mean() <= SPARSE_SHARE and nonempty.all():
        rows, cols = np.nonzero(finite)
        data = matrix[rows, cols]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        return lambda x: np.maximum.reduceat(data + x[cols], starts)
    columns = np.ascontiguousarray(matrix.T)
    buf = np.empty_like(columns)
    return lambda x: np.add(columns, x[:, None], out=buf).max(axis=0)


_UNDECIDED = (-1, -1, 0.0)


def _first_cycle(hist: np.ndarray, probe: np.ndarray, first: int, last: int, depth: int,
                 tol: float, high: float) -> tuple[int, int, float] | None:
    """(i, j, constant) of the first j in first..last whose iterate equals iterate i (the
    latest such among the ``depth`` before j) plus one constant to ``tol``, or None; the
    same for every tolerance in [tol, high], else ``_UNDECIDED`` (a spread on the way lies
    above ``tol`` and at most ``high``).

    An earlier iterate is compared in full only where the ``probe`` coordinates already differ
    by one constant to that tolerance (necessary: the spread over all coordinates is at least
    the spread over the probes), so the same iterate matches as comparing all."""
    lo = max(0, first - depth)
    seen = hist[lo:last + 1][:, probe]
    js, earlier = np.arange(first, last + 1), np.arange(lo, last)
    near = seen[js - lo][:, None, :] - seen[:last - lo][None, :, :]
    ok = (near.max(axis=2) - near.min(axis=2) <= high) & (earlier[None, :] < js[:, None]) \
        & (earlier[None, :] >= js[:, None] - depth)
    for row in np.flatnonzero(ok.any(axis=1)):
        j, cand = int(js[row]), earlier[ok[row]]
        gaps = hist[j][None, :] - hist[cand]
        spread = gaps.max(axis=1) - gaps.min(axis=1)
        if ((spread > tol) & (spread <= high)).any():
            return _UNDECIDED
        same = np.flatnonzero(spread <= tol)
        if same.size:
            return int(cand[same[-1]]), j, float(gaps[same[-1]].max())
    return None


PROBES = 4          # coordinates every earlier iterate is screened on before a full comparison


@dataclass(frozen=True)
class _Part:
    """Some actions of a compiled step (ascending positions: topological order), with their
    rank predecessor, remote inputs and p2p boundaries as lists, for ``_run_part``.  The
    inputs are positions in ``ends_list``: a missing rank predecessor reads its 0.0 slot, a
    missing remote input (or a second one of an action without a first) its −inf slot."""

    at: np.ndarray
    positions: list[int]
    prev: list[int]
    dep1: list[int]
    dep2: list[int]
    bnd1: np.ndarray
    bnd2: np.ndarray
    by_level: np.ndarray         # indices into ``at`` by level (``_levels``), and where each level starts
    level_starts: np.ndarray


@memo(256)
def _parts(comp: Compiled, per: Period) -> tuple[_Part, _Part, np.ndarray]:
    """(the past C_T: actions with reach < T, the tail: the others, every action's rank).
    C_T is down-closed, so its actions wait only on its own; the tail waits on its own and on
    F_T = σ F_S."""
    prev = np.asarray(per.prev)
    return (part_of(comp, prev, np.flatnonzero(per.reach < per.split)),
            part_of(comp, prev, np.flatnonzero(per.reach >= per.split)), np.asarray(comp.rank))


def part_of(comp: Compiled, prev: np.ndarray, at: np.ndarray) -> _Part:
    """The ``_Part`` of ``comp``'s actions ``at`` (ascending positions), ``prev`` every action's
    rank predecessor (−1: none)."""
    zero, none = len(comp.ops), len(comp.ops) + 1       # ``ends_list``' slots
    dep1, dep2 = np.asarray(comp.dep1), np.asarray(comp.dep2)
    positions, p, d1, d2 = at.tolist(), prev[at].tolist(), dep1[at].tolist(), dep2[at].tolist()
    level = _levels(positions, p, d1, d2)
    by_level = np.argsort(level, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(level[by_level]) > 0]) if len(at) else np.zeros(0, np.int64)
    return _Part(at, positions, [x if x >= 0 else zero for x in p], [x if x >= 0 else none for x in d1],
                 [x if x >= 0 and a >= 0 else none for x, a in zip(d2, d1)], comp.bnd1[at], comp.bnd2[at],
                 by_level, starts)


def _levels(positions: list[int], prev: list[int], dep1: list[int], dep2: list[int]) -> np.ndarray:
    """Per action of a part, 1 + the highest level among its inputs in the part (0: none).
    Inputs come earlier in the topological order than their actions, so every one indexes
    ``level`` below its last slot, which stays −1 and stands for a missing input (−1)."""
    level = [-1] * ((positions[-1] + 2) if positions else 1)
    for q, a, b, c in zip(positions, prev, dep1, dep2):
        x, y, z = level[a], level[b], level[c]
        level[q] = 1 + (x if x >= y and x >= z else y if y >= z else z)
    return np.array([level[q] for q in positions], dtype=np.int64)


def _tail_bound(tail: _Part, dur_arr: np.ndarray, times: StageTimes, known: float) -> float:
    """An upper bound on the short step's largest end, from ``known`` ≥ every end outside the
    tail: an action ends at most max(its inputs' ends) + max(its p2p) + its duration, so an
    action of level ℓ at most ``known`` + Σ_{ℓ' ≤ ℓ} max over level ℓ' of (duration + p2p);
    plus a relative 1e-9 for the sums' rounding."""
    if not len(tail.at):
        return known
    cost = dur_arr[tail.at] + np.maximum(times.p2p[tail.bnd1], times.p2p[tail.bnd2])
    return (known + float(np.maximum.reduceat(cost[tail.by_level], tail.level_starts).sum())) * (1 + 1e-9)


def ends_list(n: int) -> list[float]:
    """End times of a compiled step's ``n`` actions for ``_run_part`` (0.0 until run), then
    its two input slots: 0.0 (no rank predecessor) and −inf (no remote input)."""
    return [0.0] * (n + 1) + [-np.inf]


def _run_part(part: _Part, dur_arr: np.ndarray, ends: list[float], times: StageTimes) -> None:
    """End times of ``part``'s actions into ``ends`` (``ends_list``), from the ends already
    there of what they wait on: the hot loop of events._run (a rank is free when its
    predecessor ended, the same max and sums in the same order: a missing input reads 0.0 or
    −inf, which no comparison takes), on the part's own arrays."""
    l1 = times.p2p[part.bnd1].tolist()
    l2 = times.p2p[part.bnd2].tolist()
    for q, pq, a, la, b2, lb, du in zip(part.positions, part.prev, part.dep1, l1, part.dep2, l2,
                                        dur_arr[part.at].tolist()):
        t = ends[pq]
        x = ends[a] + la
        if x > t:
            t = x
        x = ends[b2] + lb
        if x > t:
            t = x
        ends[q] = t + du
