"""ZeRO-3 (and ZeRO-2) as FSDP2 runs it: per-unit all-gathers and reduce-scatters overlapped layer by layer.

FSDP2 (``fully_shard`` on every transformer block and on the root: embedding, final norm, head)
gathers a unit's parameters just before its forward and backward, and reduce-scatters its
gradients right after its backward.  All of a rank's FSDP collectives share its links, so they
run one after another on one *link* (FIFO in issue order) while the GPU computes the units in
order.  Per micro-batch and pipeline chunk, units u = 0..n−1 in forward order (seconds):

* forward: AG_u is issued when unit u−d starts computing (``prefetch`` depth d; FSDP2's implicit
  prefetch is d = 1) and starts once the link is free; unit u computes from
  max(end of unit u−1, end of AG_u).  The first all-gather (the root's) is never hidden.
* backward (reverse order): with ``reshard`` (reshard-after-forward on), every unit but the root
  and the last block (FSDP2 and torchtitan keep those gathered) is gathered again, prefetched the
  same way; RS_u is issued when u's backward ends.  The last reduce-scatter (the root's) is never
  hidden.  Off: the parameters stay gathered from the first forward (more memory, no backward AG).
* exposed = the pass's makespan − its compute (F, B + W and exposed per-layer communication).
  With ``detail``, ``step_exposure`` also returns the collectives it charged (``DpComm``, one per
  kind, phase and group): every moment the compute waits (or the pass's tail after it) lies
  inside one collective's time on the link, and is charged to that one, so each collective's
  exposed seconds are at most its time and they add up to the exposure.
* per-layer collectives on the same links: when the data-parallel group lies inside one NVLink
  domain, the tp/cp/ep collectives of the unit computing while an FSDP collective runs take the
  link first (they are on the critical path), so that FSDP collective lasts its own time plus
  theirs (its time in the charged records).  Across nodes the NIC is the bottleneck and NVLink
  traffic does not slow it.

How often, per step (m micro-batches): gathers every micro-batch with reshard on, once (the first
forward) with it off; reduce-scatters every micro-batch at pp = 1 (FSDP2 without ``no_sync``, as
torchtitan accumulates gradients) and once, at the last backward of each chunk, at pp > 1
(``torch.distributed.pipelining`` disables gradient sync and resharding until then; torchtitan
turns reshard-after-forward off under PP).  ``EstimateOptions.fsdp_grad_sync`` overrides that
default ("microbatch" | "step"): a runtime that keeps gradient sync on under PP (FSDP2's
``set_requires_gradient_sync(True)``) reduce-scatters after every micro-batch's backward and
accumulates the fp32 shard; one under no-sync accumulates the unsharded gradient until the step's
last backward (``autoplan.cost.memory`` prices both).

ZeRO-2 is the same simulation with reshard off and gradients reduced every micro-batch (FSDP2's
SHARD_GRAD_OP, DeepSpeed ZeRO-2 with ``overlap_comm``): each micro-batch's backward ends with its
root's reduce-scatter (and whatever of the queue the compute did not cover) exposed, since both
runtimes wait for the reduction stream at the end of every backward (FSDP2's
``finalize_backward``, DeepSpeed's reduction epilogue).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost.context import PlanContext
from autoplan.cost.prices import Prices
from autoplan.cost.types import GRAD_SYNCS, DpComm, EstimateOptions, Part
from autoplan.errors import UserError
from autoplan.plan import Plan
from costmodels.precision import gather_bytes_per_param

PARAM_GATHER_BYTES = 2.0           # parameters gathered in bf16
GRAD_REDUCE_BYTES = 4.0            # gradients reduce-scattered in fp32 (FSDP2 reduce_dtype, torchtitan's default)
DEFAULT_PREFETCH = 1               # FSDP2's implicit one-unit-ahead prefetch


@dataclass(frozen=True)
class Policy:
    """How the runtime overlaps ZeRO-3: prefetch depth, reshard-after-forward, gradient sync."""

    prefetch: int
    reshard: bool                  # reshard after forward (gather again in backward)
    reduce_every_microbatch: bool  # False: once per step, at the last backward


def policy(options: EstimateOptions, plan: Plan) -> Policy:
    """The runtime's defaults (FSDP2 / torchtitan) unless the options say otherwise.  ZeRO-2 is
    FSDP2's SHARD_GRAD_OP (DeepSpeed ZeRO-2 alike): ZeRO-3 with reshard-after-forward off, the
    parameters gathered once, at the step's first forward; gradients synced as ZeRO-3's."""
    reshard = False if plan.zero == 2 else options.fsdp_reshard_after_forward
    if reshard is None:
        reshard = plan.pp == 1
    sync = options.fsdp_grad_sync or ("microbatch" if plan.pp == 1 else "step")
    if sync not in GRAD_SYNCS:
        raise UserError(f"unknown FSDP gradient sync {sync!r}", f"use one of: {', '.join(GRAD_SYNCS)}")
    return Policy(max(1, options.fsdp_prefetch), reshard, sync == "microbatch")


class Piece(NamedTuple):
    """One collective of a unit on one group: a unit's all-gather (or reduce-scatter) is its dense
    group's then its expert group's."""

    ranks: tuple[int, ...]
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class Unit:
    """One FSDP unit of a chunk, per micro-batch, in forward order."""

    forward_s: float
    backward_s: float
    gather_s: float                # its all-gather (0 when another unit gathers its parameters)
    reduce_s: float                # its reduce-scatter
    link_fwd_s: float              # per-layer collectives sharing the link while it computes
    link_bwd_s: float
    kept: bool = False             # not resharded after forward (root, last block)
    gathers: tuple[Piece, ...] = ()   # what gather_s adds up (the charged records name them)
    reduces: tuple[Piece, ...] = ()


def _pieces(prices: Prices, kind: str, per_elem: float, dense: float, expert: float, dp_ranks: tuple[int, ...],
            edp_ranks: tuple[int, ...]) -> tuple[float, tuple[Piece, ...]]:
    """(seconds, pieces) of a unit's collective on its dense and expert dp groups."""
    d = Piece(tuple(dp_ranks), dense * per_elem, prices.collective(kind, dense * per_elem, dp_ranks))
    e = Piece(tuple(edp_ranks), expert * per_elem, prices.collective(kind, expert * per_elem, edp_ranks))
    return d.seconds + e.seconds, tuple(x for x in (d, e) if x.seconds > 0)


def chunk_units(ctx: PlanContext, bag: list[tuple[Part, int]], has_pre: bool, has_post: bool,
                shared_link: bool) -> list[Unit]:
    """A chunk's units in forward order.  ``pp.stage_bags`` appends ``@pre`` (embedding) to the
    first chunk's bag and then ``@post`` (norm, head, loss) to the last chunk's.  The chunk's root
    unit (both) is gathered first, with no compute of its own, and reduce-scattered last; the
    embedding computes before the blocks and the head after them; the last block is kept gathered.
    A block's parameters are gathered at ``costmodels.precision.gather_bytes_per_param`` of the
    plan's precision (1 where FSDP2 gathers FP8 weights), the root's in bf16.  Gathers and
    reduce-scatters run on rank 0's dense and expert dp groups; ``shared_link``: the per-layer
    collectives share their links (``Estimator._zero3_exposed``)."""
    prices, grad_bytes = ctx.prices, ctx.options.grad_reduce_bytes
    dp_ranks, edp_ranks = ctx.mesh.group(DENSE_DP), ctx.mesh.group(EXPERT_DP)
    gather_bytes = gather_bytes_per_param(ctx.plan.precision, ctx.plan.zero)

    def unit(p: Part | None, dense: float, expert: float, kept: bool, gathered: float = gather_bytes) -> Unit:
        if p is None:
            fwd = bwd = link_f = link_b = 0.0
        else:
            fwd, bwd = p.forward_s + p.exposed_fwd_s, p.backward_s + p.wgrad_s + p.exposed_bwd_s
            link_f = sum(c.seconds for c in p.comms if c.phase == "forward") if shared_link else 0.0
            link_b = sum(c.seconds for c in p.comms if c.phase == "backward") if shared_link else 0.0
        gather_s, gathers = _pieces(prices, "all_gather", gathered, dense, expert, dp_ranks, edp_ranks)
        reduce_s, reduces = _pieces(prices, "reduce_scatter", grad_bytes, dense, expert, dp_ranks, edp_ranks)
        return Unit(fwd, bwd, gather_s, reduce_s, link_f, link_b, kept, gathers, reduces)

    split = len(bag) - has_pre - has_post
    roots = [p for p, _ in bag[split:]]
    body = [u for p, n in bag[:split] for u in [unit(p, p.dense_numel, p.expert_numel, False)] * n]
    if body:
        body[-1] = dataclasses.replace(body[-1], kept=True)
    if not roots:
        return body
    gather = unit(None, sum(p.dense_numel for p in roots), sum(p.expert_numel for p in roots), True,
                  PARAM_GATHER_BYTES)
    pre = [unit(roots[0], 0.0, 0.0, True)] if has_pre else []
    post = [unit(roots[-1], 0.0, 0.0, True)] if has_post else []
    return [gather] + pre + body + post


@dataclass
class _Trace:
    """A pass's timeline: the collectives on the link (begin, end, unit, kind) and the intervals
    the compute waits, both in time order."""

    link: list[tuple[float, float, Unit, str]] = field(default_factory=list)
    idle: list[tuple[float, float]] = field(default_factory=list)


def _forward(units: list[Unit], prefetch: int, gather: bool, trace: _Trace | None = None) -> float:
    """Makespan of one forward pass (see the module docstring)."""
    link = comp_end = 0.0
    starts: list[float] = []
    for i, u in enumerate(units):
        ready = comp_end
        if gather and u.gather_s:
            issue = starts[i - prefetch] if i >= prefetch else 0.0
            begin = max(link, issue)
            link = begin + u.gather_s + (units[i - 1].link_fwd_s if i else 0.0)
            ready = max(ready, link)
            if trace is not None:
                trace.link.append((begin, link, u, "all_gather"))
        if trace is not None and ready > comp_end:
            trace.idle.append((comp_end, ready))
        starts.append(ready)
        comp_end = ready + u.forward_s
    if trace is not None and link > comp_end:
        trace.idle.append((comp_end, link))
    return max(comp_end, link)


def _backward(units: list[Unit], prefetch: int, gather: bool, reduce: bool, trace: _Trace | None = None) -> float:
    """Makespan of one backward pass (units in reverse order; see the module docstring)."""
    order = units[::-1]
    link = comp_end = 0.0
    starts: list[float] = []
    pending: list[tuple[float, float, Unit]] = []   # (issue time, seconds, unit) of reduce-scatters not yet on the link

    def flush(at: float, secs: float, u: Unit) -> float:
        begin = max(link, at)
        if trace is not None:
            trace.link.append((begin, begin + secs, u, "reduce_scatter"))
        return begin + secs

    for i, u in enumerate(order):
        ready = comp_end
        if gather and not u.kept and u.gather_s:
            issue = starts[i - prefetch] if i >= prefetch else 0.0
            while pending and pending[0][0] <= issue:
                link = flush(*pending.pop(0))
            begin = max(link, issue)
            link = begin + u.gather_s + (order[i - 1].link_bwd_s if i else 0.0)
            ready = max(ready, link)
            if trace is not None:
                trace.link.append((begin, link, u, "all_gather"))
        if trace is not None and ready > comp_end:
            trace.idle.append((comp_end, ready))
        starts.append(ready)
        comp_end = ready + u.backward_s
        if reduce and u.reduce_s:
            nxt = order[i + 1].link_bwd_s if i + 1 < len(order) else 0.0
            pending.append((comp_end, u.reduce_s + nxt, u))
    for p in pending:
        link = flush(*p)
    if trace is not None and link > comp_end:
        trace.idle.append((comp_end, link))
    return max(comp_end, link)


def passes(pol: Policy, m: int) -> tuple[int, int, int]:
    """Per step: (forward passes that gather, backward passes that reduce-scatter, backward passes
    that gather without reducing)."""
    gathers = m if pol.reshard else 1
    reduces = m if pol.reduce_every_microbatch else 1
    return gathers, reduces, (m - reduces) if pol.reshard else 0


@dataclass(frozen=True)
class Exposure:
    """What ZeRO-2/3 adds to one pipeline rank's step: ``seconds``, and (priced with ``detail``)
    the collectives that charge them (``DpComm``, ``when`` the phase: each one's ``seconds`` is
    its time on the link over the step, ``exposed_s`` its share of ``seconds``)."""

    seconds: float
    colls: tuple[DpComm, ...] = ()


class _Charges:
    """Sums the charged collectives by (kind, phase, group)."""

    def __init__(self) -> None:
        self.acc: dict[tuple[str, str, tuple[int, ...]], list[float]] = {}

    def add_pass(self, trace: _Trace, phase: str, times: int, exposed: float) -> None:
        """A pass that runs ``times`` per step and exposes ``exposed`` seconds (the makespan less
        the compute, as charged): each wait of the compute goes to the collectives on the link
        meanwhile (``_overlaps``), scaled to ``exposed`` so rounding cannot open a gap."""
        if times == 0:
            return
        rows = _overlaps(trace)
        attributed = sum(x for *_, x in rows)
        scale = exposed / attributed if attributed > 0 else 0.0
        for u, kind, seconds, x in rows:
            own = u.gather_s if kind == "all_gather" else u.reduce_s
            for piece in (u.gathers if kind == "all_gather" else u.reduces) or (Piece((), 0.0, own),):
                share = piece.seconds / own
                row = self.acc.setdefault((kind, phase, piece.ranks), [0.0, 0.0, 0.0, 0.0])
                row[0] += times                          # calls
                row[1] += times * piece.nbytes           # bytes
                row[2] += times * seconds * share        # seconds on the link
                row[3] += times * x * scale * share      # exposed

    def colls(self) -> tuple[DpComm, ...]:
        return tuple(DpComm(kind, nbytes / calls, round(calls), seconds, ranks, phase, min(exposed, seconds))
                     for (kind, phase, ranks), (calls, nbytes, seconds, exposed) in self.acc.items())


def _overlaps(trace: _Trace) -> list[tuple[Unit, str, float, float]]:
    """(unit, kind, seconds on the link, seconds of it the compute waited) of every collective of a pass."""
    out = []
    k, idle = 0, trace.idle
    for begin, end, u, kind in trace.link:
        while k < len(idle) and idle[k][1] <= begin:
            k += 1
        waited, j = 0.0, k
        while j < len(idle) and idle[j][0] < end:
            waited += max(0.0, min(end, idle[j][1]) - max(begin, idle[j][0]))
            j += 1
        out.append((u, kind, end - begin, waited))
    return out


def step_exposure(chunks: list[list[Unit]], pol: Policy, m: int, hide: float = 1.0, *,
                  detail: bool = False) -> Exposure:
    """Exposed FSDP seconds of one pipeline rank per step: its chunks over m micro-batches (a
    pass with no FSDP traffic exposes nothing), and with ``detail`` the collectives charged
    (``Exposure``).  ``hide``: the share of each unit's compute the traffic can hide behind (1 at
    the point estimate; the uncertain DP overlap of ``cost.params``), applied to the compute
    windows as ``dp.dp_exposed`` applies it."""
    gathers, reduces, gather_only = passes(pol, m)
    charges = _Charges() if detail else None

    def charge(times: int, phase: str, compute: float, sim: Callable[..., float], *args: object) -> float:
        """``times`` × the exposed seconds of one pass (its makespan less ``compute``)."""
        trace = _Trace() if charges is not None else None
        exposed = max(0.0, sim(*args, trace) - compute)
        if charges is not None and trace is not None:
            charges.add_pass(trace, phase, times, exposed)
        return times * exposed

    total = 0.0
    for units in chunks:
        if hide != 1.0:
            units = [replace(u, forward_s=u.forward_s * hide, backward_s=u.backward_s * hide) for u in units]
        fwd = sum(u.forward_s for u in units)
        bwd = sum(u.backward_s for u in units)
        total += charge(gathers, "forward", fwd, _forward, units, pol.prefetch, True)
        total += charge(reduces, "backward", bwd, _backward, units, pol.prefetch, pol.reshard, True)
        if gather_only:
            total += charge(gather_only, "backward", bwd, _backward, units, pol.prefetch, True, False)
    return Exposure(total, charges.colls() if charges is not None else ())
