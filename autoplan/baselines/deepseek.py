"""``deepseek``: DeepSeek-V3's layout (DeepSeek-V3 report, arXiv 2412.19437, §3.2). MoE only.

    tp   = 1, cp = 1
    pp   = 16 (the largest divisor of the GPUs ≤ 16 with 2·pp ≤ layers on smaller setups)
    ep   = 64 ("64-way EP spanning 8 nodes"): the largest divisor of the experts and of dp
           ≤ 64; innermost (order tp-cp-ep-dp-pp), so the EP group is 64 consecutive ranks
    dp   = the rest, zero = 1
    dispatcher = DeepEP (``dispatcher=deepep``: the report's own dispatch kernels, §3.2.2: each
           token to at most 4 nodes over IB, then NVLink inside them)
    schedule = DualPipeV (vpp = 2: each rank holds two chunks in a V; dispatch/combine
           all-to-alls of one micro-batch hide under the other's compute); needs ≥ 2·pp
           micro-batches
    mbs  = 1, recompute = selective (the report recomputes RMSNorm and MLA up-projections),
           then full when nothing fits

Cannot apply to a dense model (no experts to spread).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.baselines.common import RecipeContext, divisors, ep_degree, first_that_fits
from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "deepseek"
SUMMARY = "MoE: PP 16 with DualPipeV, 64-way EP across nodes, TP 1, ZeRO-1"
FAMILIES = ("moe",)          # model families it was written for (a "credible" hand plan there)
PP = 16
EP = 64
ORDER = ("tp", "cp", "ep", "dp", "pp")


def pp_degree(num_gpus: int, layers: int) -> int:
    """16, or the largest divisor of the GPUs below it that leaves every rank two layers."""
    return max(d for d in divisors(num_gpus) if d <= PP and 2 * d <= layers)


def ladder(ctx: RecipeContext) -> Iterator[Plan]:
    pp = pp_degree(ctx.num_gpus, ctx.layers)
    dp = ctx.num_gpus // pp
    schedule, vpp = ("dualpipev", 2) if pp > 1 else ("1f1b", 1)
    for recompute in ("selective", "full"):
        ep = ep_degree(ctx.info, dp, cap=EP)
        yield Plan(tp=1, pp=pp, dp=dp, ep=ep, vpp=vpp, mbs=1, schedule=schedule, recompute=(recompute,),
                   zero=1 if dp > 1 else 0, order=ORDER, dispatcher="deepep" if ep > 1 else "alltoall")


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
           estimator: Estimator) -> Plan:
    ctx = RecipeContext(model, cluster, seq, global_batch, estimator)
    if not ctx.info.experts:
        raise UserError(f"recipe deepseek cannot apply to {ctx.info.name}: it is a dense model "
                        "(no experts to spread over an EP group)",
                        "use a MoE model, or the megatron, megascale, llama3 or fsdp recipe")
    pp = pp_degree(ctx.num_gpus, ctx.layers)
    dp = ctx.num_gpus // pp
    if pp > 1 and global_batch < 2 * pp * dp:
        raise UserError(f"recipe deepseek cannot apply to {ctx.info.name} on {cluster.name}: DualPipeV on pp = {pp} "
                        f"needs ≥ {2 * pp} micro-batches per step, global batch {global_batch} over dp = {dp} "
                        f"gives {global_batch / dp:g}",
                        f"pass --global-batch {2 * pp * dp} or more (a multiple of {dp})")
    return first_that_fits(NAME, ctx, ladder(ctx))
