"""A recipe tuned within its family: what a careful engineer runs after the recipe has picked
the degrees.

    plan = tuned(recipe_plan, estimator, global_batch)

The recipe's degrees (tp, cp, ep, pp, dp), ZeRO stage, SP, CP algorithm, rank order and
stage cuts are kept; the knobs every launch script exposes are tried:

* micro-batch size ∈ ``MBS`` (dividing the per-rank batch);
* virtual stages: for a recipe on the 1F1B family, plain 1F1B and interleaved 1F1B with every
  vpp ≤ ``MAX_VPP`` that splits the layers evenly (Megatron's ``num_layers % (pp·vpp) == 0``)
  when the micro-batches are a multiple of pp; another schedule (DualPipeV, a zero-bubble one)
  is kept as the recipe wrote it;
* one recomputation policy for every stage ∈ ``RECOMPUTE`` (Megatron's
  ``--recompute-granularity`` and torchtitan's activation-checkpointing modes).

The fastest plan that fits wins; the recipe's own plan where no variant beats it.  A hand
baseline tuned like this is what the benchmark compares the search against (issue 36: the
baseline is what a careful engineer would run, not the recipe's first guess).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.errors import UserError
from autoplan.plan import Plan

if TYPE_CHECKING:
    from autoplan.cost import Estimator

MBS = (1, 2, 4, 8)
MAX_VPP = 8              # the Megatron grid's bound (``bench.grid``): GPT-3's published layout runs vpp 6
RECOMPUTE = ("none", "selective", "full")
ONE_F_ONE_B_FAMILY = ("1f1b", "interleaved")


def variants(plan: Plan, layers: int, global_batch: int) -> Iterator[Plan]:
    """``plan`` with every micro-batch size, virtual-stage count and recompute policy of its family."""
    local = global_batch // plan.dp
    for mbs in MBS:
        if local % mbs:
            continue
        for schedule, vpp in _schedules(plan, layers, local // mbs):
            for recompute in RECOMPUTE:
                try:
                    yield plan.replace(mbs=mbs, schedule=schedule, vpp=vpp, recompute=(recompute,))
                except UserError:       # a combination the plan grammar refuses
                    continue


def _schedules(plan: Plan, layers: int, microbatches: int) -> list[tuple[str, int]]:
    if plan.pp == 1 or plan.schedule not in ONE_F_ONE_B_FAMILY or plan.layers:
        return [(plan.schedule, plan.vpp)]
    out = [("1f1b", 1)]
    if microbatches % plan.pp == 0:
        out += [("interleaved", v) for v in range(2, MAX_VPP + 1) if layers % (plan.pp * v) == 0]
    return out


def tuned(plan: Plan, estimator: Estimator, global_batch: int) -> Plan:
    """The fastest plan that fits among ``plan`` and its ``variants`` (ties: the recipe's own, then
    the plan string); ``plan`` itself when none fits."""
    def key(p: Plan) -> tuple[float, int, str] | None:
        try:
            e = estimator.estimate(p, global_batch, detail=False)
        except UserError:
            return None
        return (e.step_time_s, int(p != plan), p.to_string()) if e.fits else None

    scored = [(k, p) for p in (plan, *variants(plan, estimator.model.num_layers, global_batch))
              if (k := key(p)) is not None]
    return min(scored, key=lambda kp: kp[0])[1] if scored else plan
