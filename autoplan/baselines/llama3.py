"""``llama3``: Meta's Llama 3 recipe (Llama 3 report, arXiv 2407.21783, §3.3.2; torchtitan).

    tp   = 8 inside one NVLink domain (``tp_degree`` capped at 8), sp = on
    cp   = seq ≥ 32K only: seq / 8K (the report's 128K run used cp = 16), the largest degree
           ≤ that dividing the GPUs left after tp and the sequence; ring attention (the
           report's all-gathered K/V moves the same bytes as a K/V ring)
    pp   = the smallest depth ≤ 16 that fits (Meta's 405B default is 16; smaller models fit
           in fewer stages), deeper only when nothing ≤ 16 fits
    dp   = the rest, as FSDP with ZeRO-2 (parameters kept after the forward, gradients and
           optimizer state sharded); outermost: order tp-cp-pp-dp (ep = 1 between cp and pp)
    vpp  = interleaved 1F1B with vpp ≤ 4 splitting the layers evenly, else 1F1B
    mbs  = with pp = 1 (pure FSDP + TP, torchtitan style) the whole local batch B/dp when it
           fits, halving towards 1 (gradient accumulation) only when it does not — ZeRO-2
           reduce-scatters gradients every micro-batch, so fewer micro-batches are cheaper;
           with pp > 1, mbs = 1 (the pipeline needs the micro-batches)
    recompute = selective, then full, tried for each mbs before the next smaller one

MoE models run with ep = 1 (experts sharded by tp and FSDP only): Llama 3 is dense.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.baselines.common import RecipeContext, divisors, first_that_fits, interleaving, microbatches, tp_degree
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "llama3"
SUMMARY = "TP 8, CP seq/8K when seq ≥ 32K, smallest PP ≤ 16 that fits, FSDP (ZeRO-2) DP outermost"
FAMILIES = ("dense",)          # model families it was written for (a "credible" hand plan there)
ORDER = ("tp", "cp", "ep", "pp", "dp")
LONG_CONTEXT = 32768          # CP from this sequence length on
CP_TOKENS = 8192              # tokens per CP rank (128K / 16)
PP_DEFAULT_MAX = 16


def cp_degree(seq: int, room: int) -> int:
    """CP degree for ``seq`` tokens: seq / 8K from 32K on, the largest divisor of ``room``
    (GPUs left after tp) and of ``seq`` not above that."""
    if seq < LONG_CONTEXT:
        return 1
    want = seq // CP_TOKENS
    return max(d for d in divisors(room) if d <= want and seq % d == 0)


def ladder(ctx: RecipeContext, tp: int, cp: int) -> Iterator[Plan]:
    depths = [pp for pp in divisors(ctx.num_gpus // (tp * cp)) if pp <= ctx.layers]
    depths = [pp for pp in depths if pp <= PP_DEFAULT_MAX] + [pp for pp in depths if pp > PP_DEFAULT_MAX]
    for pp in depths:
        dp = ctx.num_gpus // (tp * cp * pp)
        local = ctx.global_batch // dp if ctx.global_batch % dp == 0 else 1
        for mbs in (reversed(divisors(local)) if pp == 1 else (1,)):
            schedule, vpp = interleaving(ctx.layers, pp, microbatches(ctx.global_batch, dp, mbs))
            for recompute in ("selective", "full"):
                yield Plan(tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, mbs=mbs, schedule=schedule,
                           recompute=(recompute,), sp=tp > 1, zero=2 if dp > 1 else 0, cp_algo="ring",
                           order=ORDER)


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
           estimator: Estimator) -> Plan:
    ctx = RecipeContext(model, cluster, seq, global_batch, estimator)
    tp = tp_degree(ctx.info, cluster, cap=8)
    cp = cp_degree(seq, cluster.num_gpus // tp)
    return first_that_fits(NAME, ctx, ladder(ctx, tp, cp))
