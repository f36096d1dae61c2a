"""How much of a step a low-precision plan saves: the same plan priced again in bf16.

``explain`` prints it under "Precision" (and in its JSON), ``search`` under its table for every
listed plan whose linear GEMMs run in FP8.  The bf16 plan keeps every other choice (mesh, cuts,
micro-batch, recomputation): the difference is the precision's alone — GEMMs at the FP8 peak
less the casts they add (``costmodels.precision``), nothing re-searched around it.  Where the
bf16 plan does not fit in memory (FP8 keeps smaller linear inputs) the note says so: its step
is then a price, not a plan that runs.  Where the engine reruns recomputed layers outside its FP8
context (``EstimateOptions.fp8_recompute``) the note says that only their first forward is FP8.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.cost import Estimate, Estimator
from autoplan.plan import Plan, fully_recomputes


@dataclass(frozen=True)
class PrecisionSaving:
    """A low-precision plan's step against the same plan in bf16."""

    precision: str
    step_s: float
    bf16_step_s: float
    bf16_fits: bool
    bf16_memory_gib: float
    recompute_in_bf16: bool = False     # recomputed layers rerun and back-propagate in bf16

    @property
    def saving(self) -> float:
        """Share of the bf16 step the precision saves (negative: it costs time)."""
        return 1.0 - self.step_s / self.bf16_step_s

    def text(self) -> str:
        verb = "saves" if self.saving >= 0 else "costs"
        fit = "" if self.bf16_fits else f"; in bf16 it needs {self.bf16_memory_gib:.1f} GiB per GPU and does not fit"
        rerun = ("; its recomputed layers rerun and back-propagate in bf16, only their first forward is FP8 "
                 "(--fp8-recompute bf16)") if self.recompute_in_bf16 else ""
        return (f"precision {self.precision}: {self.step_s:.3f} s per step against {self.bf16_step_s:.3f} s for "
                f"the same plan in bf16 — {verb} {abs(self.saving):.1%} of the step{fit}{rerun}")

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "step_time_s": self.step_s, "bf16_step_time_s": self.bf16_step_s,
                "saving": self.saving, "bf16_fits": self.bf16_fits, "bf16_memory_gib": self.bf16_memory_gib,
                "recompute_in_bf16": self.recompute_in_bf16}


def precision_saving(estimator: Estimator, plan: Plan, estimate: Estimate, global_batch: int) -> PrecisionSaving | None:
    """``plan``'s saving against itself in bf16 (``estimate``: ``plan``'s, by ``estimator``); None
    for a bf16 plan."""
    if plan.precision == "bf16":
        return None
    bf16 = estimator.estimate(plan.replace(precision="bf16"), global_batch, detail=False)
    rerun = estimator.options.fp8_recompute == "bf16" and any(fully_recomputes(r) for r in plan.recompute)
    return PrecisionSaving(plan.precision, estimate.step_time_s, bf16.step_time_s, bf16.fits, bf16.memory_gib, rerun)
