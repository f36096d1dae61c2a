"""What the hand-written recipes share: degree pickers and "the first candidate that fits".

A recipe is written the way an engineer writes a launch script: fixed rules for TP, CP and
EP, then a short ladder of fall-backs (more pipeline stages, more recomputation) tried in
order until the plan fits in HBM.  ``first_that_fits`` walks that ladder with the shared
cost model (``Estimator``) and raises ``UserError`` saying why when nothing on it applies.

Vocabulary: *axis* = a mesh axis (tp, cp, ep, dp, pp); *degree* = its size.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.errors import UserError
from autoplan.ir import BlockGraph, ModelInfo
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:   # the cost model is only called, never needed to import a recipe
    from autoplan.cost import Estimator

MAX_VPP = 4
"""Megatron users' habit: at most 4 model chunks per pipeline rank (more chunks cut the
bubble further but multiply the P2P traffic and the warm-up memory)."""


@dataclass(frozen=True)
class RecipeContext:
    """Everything a recipe reads: the traced model, the cluster, the batch and the cost model."""

    model: BlockGraph
    cluster: Cluster
    seq: int
    global_batch: int
    estimator: Estimator

    @property
    def info(self) -> ModelInfo:
        return self.model.model

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def layers(self) -> int:
        return self.model.num_layers


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degree(info: ModelInfo, cluster: Cluster, cap: int) -> int:
    """Largest TP degree ≤ ``cap`` that engineers can use inside one NVLink domain.

    It must divide the NVLink domain (so every TP group sits in one domain), the GPU count,
    the attention heads, and either divide the KV heads or be a multiple of them (GQA: KV
    heads are replicated when tp > kv_heads).  On an 8-GPU HGX domain this is 8 for every
    zoo model; on a 72-GPU NVL72 domain it is the largest common divisor of 72 and the heads
    (8 for 64 or 128 heads, 24 for GPT-3's 96).
    """
    best = 1
    for d in divisors(min(cap, cluster.nvlink_domain)):
        if cluster.nvlink_domain % d or cluster.num_gpus % d:
            continue
        if info.heads and info.heads % d:
            continue
        kv = info.kv_heads or info.heads
        if kv and d % kv and kv % d:
            continue
        best = d
    return best


def ep_degree(info: ModelInfo, dp: int, cap: int) -> int:
    """Largest expert-parallel degree ≤ ``cap`` dividing both the experts and ``dp``
    (EP is carved out of DP); 1 for dense models."""
    if not info.experts:
        return 1
    return max(d for d in divisors(min(cap, dp)) if info.experts % d == 0 and dp % d == 0)


def interleaving(layers: int, pp: int, microbatches: int) -> tuple[str, int]:
    """(schedule, vpp) as Megatron users pick them for ``pp`` stages.

    Interleaved 1F1B with the largest vpp ≤ ``MAX_VPP`` that splits the layers evenly into
    pp·vpp chunks (Megatron's ``num_layers % (pp·vpp) == 0``) when the micro-batches are a
    multiple of pp (Megatron's interleaved-schedule requirement); otherwise plain 1F1B
    (vpp = 1), whose even split puts any extra layers on the middle stages.
    """
    if pp == 1:
        return "1f1b", 1
    if microbatches % pp == 0:
        for v in range(MAX_VPP, 1, -1):
            if layers % (pp * v) == 0:
                return "interleaved", v
    return "1f1b", 1


def microbatches(global_batch: int, dp: int, mbs: int = 1) -> int:
    """Micro-batches per pipeline per step, B / (dp·mbs) (0 when dp·mbs > B)."""
    return global_batch // (dp * mbs)


def first_that_fits(recipe: str, ctx: RecipeContext, candidates: Iterable[Plan]) -> Plan:
    """The first candidate that is valid for the model, cluster and batch and fits in HBM.

    Raises UserError naming why the recipe cannot apply: the smallest memory need among the
    valid candidates (when none fits), or the first candidate's validation error (when none
    is valid, e.g. a global batch too small for the pipeline).
    """
    first_error: UserError | None = None
    closest: tuple[float, Plan] | None = None
    for plan in candidates:
        try:
            est = ctx.estimator.estimate(plan, ctx.global_batch)
        except UserError as e:
            first_error = first_error or e
            continue
        if est.fits:
            return plan
        if closest is None or est.memory_gib < closest[0]:
            closest = (est.memory_gib, plan)
    where = f"{ctx.info.name} on {ctx.cluster.name} (seq {ctx.seq}, global batch {ctx.global_batch})"
    if closest is not None:
        gpu = ctx.cluster.gpu
        raise UserError(
            f"recipe {recipe} cannot apply to {where}: no plan on its ladder fits in memory; the "
            f"closest ({closest[1].to_string()}) needs {closest[0]:.1f} GiB per GPU, {gpu.name} has "
            f"{gpu.hbm_bytes / 2**30:.1f} GiB",
            "use more GPUs or GPUs with more memory, a shorter sequence, or another recipe")
    if first_error is not None:
        raise UserError(f"recipe {recipe} cannot apply to {where}: {first_error.problem}",
                        first_error.fix) from None
    raise UserError(f"recipe {recipe} cannot apply to {where}: no pipeline depth divides the "
                    f"{ctx.num_gpus} GPUs within the model's {ctx.layers} layers",
                    "use a GPU count with more small factors (e.g. a power of two)")
