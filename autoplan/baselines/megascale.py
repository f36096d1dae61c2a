"""``megascale``: ByteDance's MegaScale layout (Jiang et al., NSDI'24) on Megatron-LM.

    tp   = 8 inside one NVLink domain (``tp_degree`` capped at 8), sp = on
    pp   = the smallest depth that fits (as ``megatron``), placed across IB: the order
           tp-cp-ep-pp-dp puts pipeline neighbours on consecutive nodes
    dp   = outermost (the pods): the once-per-step gradient reduce-scatter and parameter
           all-gather take the slowest links, overlapped with the last backward/first forward
    ep   = MoE only, as ``megatron`` (≤ 8, dividing experts and dp)
    zero = 1, interleaved 1F1B (vpp ≤ 4 as ``megatron``), selective recompute, mbs = 1

Adaptation: full recomputation when nothing fits with selective (as ``megatron``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.baselines.common import RecipeContext, first_that_fits, tp_degree
from autoplan.baselines.megatron import megatron_ladder
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "megascale"
SUMMARY = "TP 8 in NVLink, PP across IB, DP outermost (order tp-cp-ep-pp-dp), ZeRO-1, interleaved, selective"
FAMILIES = ("dense", "moe")          # model families it was written for (a "credible" hand plan there)
ORDER = ("tp", "cp", "ep", "pp", "dp")


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
           estimator: Estimator) -> Plan:
    ctx = RecipeContext(model, cluster, seq, global_batch, estimator)
    tp = tp_degree(ctx.info, cluster, cap=8)
    return first_that_fits(NAME, ctx, megatron_ladder(ctx, tp, ORDER))
