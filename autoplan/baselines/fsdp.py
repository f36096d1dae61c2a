"""``fsdp``: plain FSDP / ZeRO-3 data parallelism (PyTorch FSDP2, DeepSpeed ZeRO-3).

    tp = pp = cp = ep = 1, dp = all GPUs, zero = 3 (parameters, gradients and optimizer
    state sharded; parameters all-gathered per micro-batch forward and backward)
    mbs = the largest divisor of the per-GPU batch (B / GPUs) that fits: every micro-batch
          re-gathers the parameters, so fewer, larger micro-batches are cheaper
    recompute = none, then selective, then full, tried for each mbs before the next smaller

Cannot apply when the global batch is smaller than the GPU count (every GPU needs at least
one sequence).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.baselines.common import RecipeContext, divisors, first_that_fits
from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "fsdp"
SUMMARY = "ZeRO-3 over all GPUs (no TP/PP/CP), least recomputation and largest micro-batch that fit"
FAMILIES = ("dense",)          # model families it was written for (a "credible" hand plan there)


def ladder(ctx: RecipeContext) -> Iterator[Plan]:
    per_gpu = ctx.global_batch // ctx.num_gpus
    for mbs in reversed(divisors(per_gpu)):
        for recompute in ("none", "selective", "full"):
            yield Plan(dp=ctx.num_gpus, mbs=mbs, recompute=(recompute,), zero=3)


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
           estimator: Estimator) -> Plan:
    ctx = RecipeContext(model, cluster, seq, global_batch, estimator)
    if global_batch % cluster.num_gpus:
        raise UserError(f"recipe fsdp cannot apply: global batch {global_batch} does not split evenly "
                        f"over {cluster.num_gpus} GPUs (pure data parallelism needs a multiple of the GPU count)",
                        f"pass --global-batch {max(1, -(-global_batch // cluster.num_gpus)) * cluster.num_gpus}")
    return first_that_fits(NAME, ctx, ladder(ctx))
