"""What an Estimate reports besides the step time: the primitive table, the time breakdown, violations.

Primitives are aggregated on the *busiest* pipeline rank (most simulated busy seconds; ties: the
first), per step, by (collective kind, what it is for, group size, level of the hardware).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.axes import Axis
from autoplan.cost.context import PlanContext
from autoplan.cost.pp import Pipeline
from autoplan.cost.prices import Prices
from autoplan.cost.types import DpComm, Primitive, Violation
from autoplan.mesh import ranks_text
from autoplan.plan import Plan
from autoplan.rules import nvlink_breaks
from costmodels.memory import GIB

_Key = tuple[str, str, str, int, str]     # (kind, axis, purpose, group size, level)


@dataclass
class _Row:
    """One primitive's sums: its span's description, calls, bytes × calls, seconds, exposed seconds."""

    span: str
    calls: int = 0
    total: float = 0.0
    seconds: float = 0.0
    exposed: float = 0.0


class _Table:
    """Accumulates collectives into primitives keyed by (kind, axis, purpose, group size, level)."""

    def __init__(self, prices: Prices):
        self.prices = prices
        self.acc: dict[_Key, _Row] = {}

    def add(self, kind: str, axis: str, purpose: str, ranks: Sequence[int], calls: int, nbytes: float,
            seconds: float, exposed: float) -> None:
        if len(ranks) <= 1:
            return
        span = self.prices.span(ranks)
        key = (kind, axis, purpose, len(ranks), span.level)
        a = self.acc.get(key)
        if a is None:
            a = self.acc[key] = _Row(self.prices.cluster.describe_span(span))
        a.calls += calls
        a.total += nbytes * calls
        a.seconds += seconds
        a.exposed += exposed

    def primitives(self) -> list[Primitive]:
        rows = [Primitive(kind, axis, purpose, size, a.span, level, a.calls, a.total / max(a.calls, 1), a.seconds,
                          a.exposed)
                for (kind, axis, purpose, size, level), a in self.acc.items()]
        return sorted(rows, key=lambda p: (p.kind, p.traffic, p.group_size, p.level, p.purpose))


def primitives(ctx: PlanContext, m: int, pipe: Pipeline, rank: int, dp: list[DpComm], embed_bytes: float,
               embed_s: float) -> list[Primitive]:
    """The collectives of pipeline rank ``rank`` over a step of ``m`` micro-batches, as primitives:
    its parts', its stage-to-stage sends, the data-parallel ones ``dp`` the step charges (each with
    its exposed seconds: ``dp.dp_exposed``) and the tied embedding's sync."""
    plan, mesh = ctx.plan, ctx.mesh
    table = _Table(ctx.prices)
    ep_keep = _ep_share_exposed(plan, pipe, m, rank)
    for c in pipe.rank_chunks[rank]:
        for p, n in pipe.bags[c]:
            for x in p.comms:
                keep = ep_keep if x.axis == Axis.EP.value else 1.0
                table.add(x.kind, x.axis, x.purpose or x.axis, x.ranks or mesh.group(x.axis), n * m * x.calls,
                          x.nbytes, n * m * x.seconds, n * m * x.exposed_s * keep)
    pp_ranks = mesh.group(Axis.PP.value)
    if plan.pp > 1:
        sends = 2 * m * len(pipe.rank_chunks[rank])
        total = sends * pipe.p2p_s
        exposed = pipe.p2p_exposed_s
        if exposed > total and pipe.p2p_s > 0:
            # what P2P adds to the makespan can exceed this rank's own sends (the fill and drain
            # chain other stages' sends): the row counts the hops beyond them the step waits for
            extra = math.ceil((exposed - total) / pipe.p2p_s)
            sends, total = sends + extra, total + extra * pipe.p2p_s
        exposed = min(exposed, total)
        hop_share = 1.0 - pipe.gather_s / pipe.p2p_s if pipe.p2p_s else 1.0
        table.add("p2p", Axis.PP.value, "activations", pipe.p2p_hop, sends, pipe.act_bytes, total * hop_share,
                  exposed * hop_share)
        if pipe.gather_s:     # without SP: the receiver all-gathers the tp slices (Megatron's scatter/gather)
            table.add("all_gather", Axis.TP.value, "activations", mesh.group(Axis.TP.value), sends,
                      pipe.act_bytes * plan.tp, total * (1 - hop_share), exposed * (1 - hop_share))
    for d in dp:
        table.add(d.kind, Axis.DP.value, "parameters" if d.kind == "all_gather" else "gradients", d.ranks, d.calls,
                  d.nbytes, d.seconds, d.exposed_s)
    if embed_s:
        table.add("all_reduce", Axis.PP.value, "embedding", (pp_ranks[0], pp_ranks[-1]), 1, embed_bytes, embed_s,
                  embed_s)
    return table.primitives()


def _ep_share_exposed(plan: Plan, pipe: Pipeline, m: int, rank: int) -> float:
    """The share of ``rank``'s exposed EP all-to-all time that stays exposed in the step: 1, but
    under DualPipeV its overlapped F&B pairs hide part of it under the other micro-batch's compute.
    Hidden = Σ over the rank's actions of their op times (m·Σ (f + b + w) over its chunks) − the
    simulated busy time of the rank (the pairs cost max(compute, comm), not their sum); the
    share is 1 − hidden / (m·Σ EP exposed), so primitives and breakdown add up to the step."""
    if plan.schedule != "dualpipev" or plan.pp == 1:
        return 1.0
    chunks = pipe.rank_chunks[rank]
    summed = m * sum(pipe.f[c] + pipe.b[c] + pipe.w[c] for c in chunks)
    ep_total = m * sum((p.ep_fwd_s + p.ep_bwd_s) * n for c in chunks for p, n in pipe.bags[c])
    hidden = max(0.0, summed - pipe.sim.busy[rank])
    return max(0.0, 1.0 - hidden / ep_total) if ep_total > 0 else 1.0


BUBBLE_NOISE = 1e-9     # relative: costmodels.pipeline's extrapolation is exact to this (tests/costmodels)


def breakdown(prims: list[Primitive], *, compute: float, pipe: Pipeline, rank: int, dp_exposed: float,
              embed_s: float, optimizer_s: float, microbatches: int) -> dict[str, float]:
    """The step's seconds by cause on the busiest rank; pp_bubble is idle time no rank can avoid
    (zero below ``BUBBLE_NOISE`` of the step: an extrapolated step equals the full simulation to
    that relative precision, so a smaller difference is rounding, not idle time); pp_engine_host
    is the pipeline engine's host time per send/receive on that rank (``pp.engine_host``)."""
    bubble = pipe.step_s - pipe.sim.busy[rank] - pipe.p2p_exposed_s
    return {
        "compute": compute,
        "tp_comm": sum(p.time_s for p in prims if p.traffic in ("tp", "sp")),
        "cp_comm_exposed": sum(p.exposed_s for p in prims if p.axis == "cp"),
        "ep_comm_exposed": sum(p.exposed_s for p in prims if p.axis == "ep"),
        "pp_bubble": bubble if bubble > BUBBLE_NOISE * pipe.step_s else 0.0,
        "pp_p2p_exposed": pipe.p2p_exposed_s,
        "pp_engine_host": pipe.engine_host_seconds(rank, microbatches),
        "dp_exposed": dp_exposed,
        "embed_sync": embed_s,
        "optimizer": optimizer_s,
    }


def violations(ctx: PlanContext, memory_bytes: float) -> list[Violation]:
    """The hard rules a priced plan breaks (``autoplan.rules``), and memory beyond HBM less the
    margin (``EstimateOptions.memory_margin_gib``)."""
    prices, cluster, margin_gib = ctx.prices, ctx.prices.cluster, ctx.options.memory_margin_gib
    out = []
    for g, ranks in nvlink_breaks(ctx.plan, ctx.mesh, experts=ctx.model.experts, nvlink_domain=cluster.nvlink_domain):
        span = prices.span(ranks)
        out.append(Violation(g.rule, f"{g.label} group of {len(ranks)} ranks ({ranks_text(ranks)}) spans "
                                     f"{span.domains} NVLink domains over {cluster.describe_span(span)}: "
                                     f"per-layer collectives leave NVLink"))
    limit = cluster.gpu.hbm_bytes - margin_gib * GIB
    if memory_bytes > limit:
        out.append(Violation("memory", f"needs {memory_bytes / GIB:.1f} GiB per GPU, {cluster.gpu.name} has "
                                       f"{cluster.gpu.hbm_bytes / GIB:.1f} GiB less a {margin_gib:g} GiB margin "
                                       f"= {limit / GIB:.1f} GiB"))
    return out
