"""``megatron``: the Megatron-LM recipe (Narayanan et al., SC'21; Megatron-Core docs).

    tp   = the NVLink domain, capped by the heads (``tp_degree``): 8 on HGX nodes
    sp   = on (sequence parallelism: LayerNorm/dropout activations sharded by tp)
    cp   = 1
    ep   = MoE only: the largest divisor of the experts and of dp, ≤ 8 (Megatron-Core's
           usual EP for 8-expert models; it spans nodes because tp fills the domain)
    pp   = the smallest divisor of GPUs/tp (≤ layers) whose plan fits in HBM
    dp   = the rest, zero = 1 (``--use-distributed-optimizer``)
    vpp  = interleaved 1F1B with the largest vpp ≤ 4 splitting the layers evenly
           (``interleaving``); 1F1B when none does or micro-batches are not a multiple of pp
    mbs  = 1, recompute = selective (``--recompute-activations``)
    order= tp-cp-ep-dp-pp (Megatron's rank order: pp outermost)

Adaptation: when no pipeline depth fits with selective recomputation, the ladder is walked
again with full recomputation (``--recompute-granularity full``), as users do for long
sequences.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.baselines.common import (
    RecipeContext,
    divisors,
    ep_degree,
    first_that_fits,
    interleaving,
    microbatches,
    tp_degree,
)
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "megatron"
SUMMARY = "TP = NVLink domain, SP, smallest PP that fits, DP rest, interleaved 1F1B, selective recompute, ZeRO-1"
FAMILIES = ("dense", "moe")          # model families it was written for (a "credible" hand plan there)
ORDER = ("tp", "cp", "ep", "dp", "pp")


def megatron_ladder(ctx: RecipeContext, tp: int, order: tuple[str, ...]) -> Iterator[Plan]:
    """Plans with the given tp, pp ascending, first with selective then full recomputation."""
    for recompute in ("selective", "full"):
        for pp in divisors(ctx.num_gpus // tp):
            if pp > ctx.layers:
                break
            dp = ctx.num_gpus // (tp * pp)
            schedule, vpp = interleaving(ctx.layers, pp, microbatches(ctx.global_batch, dp))
            yield Plan(tp=tp, pp=pp, dp=dp, ep=ep_degree(ctx.info, dp, cap=8), vpp=vpp, mbs=1,
                       schedule=schedule, recompute=(recompute,), sp=tp > 1, zero=1 if dp > 1 else 0,
                       order=order)


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
           estimator: Estimator) -> Plan:
    ctx = RecipeContext(model, cluster, seq, global_batch, estimator)
    tp = tp_degree(ctx.info, cluster, cap=cluster.nvlink_domain)
    return first_that_fits(NAME, ctx, megatron_ladder(ctx, tp, ORDER))
