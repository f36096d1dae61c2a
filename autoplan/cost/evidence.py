"""Evidence flags: where a plan leans on a regime that no timed published run covers.

The coverage is data (``costmodels/evidence.yaml``): the pipeline schedules and ZeRO stages
with a timed published run, whether context and expert parallelism are validated (neither is
yet: their public rows are priced, but not well enough to trust a ranking), and the best MFU a
published run of its kind reached.  A plan gets one flag per regime it leans on outside that: a
schedule never validated (the V schedules zbv and dualpipev; the Zero Bubble paper's runs
validate zb-h1 and zb-h2 and their split weight-gradient pass), a ZeRO stage never validated
(ZeRO-2's per-micro-batch reduce-scatter overlap), context parallelism (ring hops hidden behind attention), MoE
(all-to-all, expert GEMMs), a linear-GEMM precision whose published runs the cost model does not yet
reproduce, an MFU above the best published run of its kind — FP8 runs are their own kind — (or any
MFU for a kind without one).  Each flag is one short sentence naming the regime and what would cover it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from autoplan.cost.params import out_of_sample_errors
from autoplan.cost.types import Estimate
from autoplan.plan import Plan
from costmodels.compute import PROFILE_DIR
from costmodels.memo import memo
from topologies.strict_load import load_yaml

EVIDENCE_PATH = os.path.join(os.path.dirname(PROFILE_DIR), "evidence.yaml")


@dataclass(frozen=True)
class Flag:
    """One regime a plan leans on without published evidence."""

    regime: str       # schedule | zero | cp | moe | precision | mfu
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"regime": self.regime, "text": self.text}


@memo(1)
def coverage() -> dict[str, Any]:
    with open(EVIDENCE_PATH) as f:
        data: dict[str, Any] = load_yaml(f.read())
        return data


def flags(plan: Plan, estimate: Estimate, *, moe: bool) -> tuple[Flag, ...]:
    """The regimes ``plan`` (priced as ``estimate``) leans on that no published run covers."""
    cov = coverage()
    out = []
    if plan.pp > 1 and plan.schedule not in cov["schedules"]:
        out.append(Flag("schedule", f"schedule {plan.schedule}: no timed published run "
                                    f"(validated: {', '.join(cov['schedules'])})"))
    if plan.dp * plan.cp > 1 and plan.zero not in cov["zero"]:
        out.append(Flag("zero", f"ZeRO-{plan.zero}: no timed published run (validated: "
                                f"{', '.join(f'ZeRO-{z}' for z in cov['zero'])})"))
    if plan.cp > 1 and not cov["context_parallel"]:
        out.append(Flag("cp", f"context parallelism ({plan.cp_algo}): no timed published run; "
                              "its overlap is a prior"))
    if moe and not cov["expert_parallel"]:
        out.append(Flag("moe", "MoE: no timed published run; all-to-all and expert GEMM efficiency are priors"))
    if plan.precision not in cov["precision"]:
        out.append(Flag("precision", f"precision {plan.precision}: no timed published run the cost model reproduces "
                                     f"(validated: {', '.join(cov['precision'])})"))
    kind = ("moe" if moe else "dense") + ("" if plan.precision == "bf16" else "-fp8")
    best = cov["max_mfu"].get(kind)
    if best is None:
        out.append(Flag("mfu", f"MFU {estimate.mfu:.1%}: no published {kind} run to compare with"))
    elif estimate.mfu > best[0]:
        out.append(Flag("mfu", f"MFU {estimate.mfu:.1%} above the best published {kind} run ({best[1]})"))
    return tuple(out)


ZERO_BUBBLE = ("zb-h1", "zb-h2", "zbv", "dualpipev")


def validated_regimes(plan: Plan, *, moe: bool) -> tuple[str, ...]:
    """The regimes of ``experiments/validate_published.py --cv`` whose rows ``plan`` is priced
    like: ``fsdp`` (ZeRO-3) or ``megatron`` (any other dense layout), plus ``schedule`` (a split
    W pass: the zero-bubble family), ``cp`` (cp > 1), ``moe`` and ``fp8-bf16`` (FP8 GEMMs)."""
    out = ["fsdp" if plan.zero == 3 and plan.dp * plan.cp > 1 else "megatron"]
    if plan.pp > 1 and plan.schedule in ZERO_BUBBLE:
        out.append("schedule")
    if plan.cp > 1:
        out.append("cp")
    if moe:
        out.append("moe")
    if plan.precision != "bf16":
        out.append("fp8-bf16")
    return tuple(out)


def leaning_errors(plan: Plan, *, moe: bool) -> dict[str, float]:
    """``{regime: out-of-sample mean |error|}`` of the regimes ``plan`` leans on
    (``validated_regimes``; ``costmodels/uncertainty_cv.yaml``), those the file has."""
    errors = out_of_sample_errors()
    return {r: errors[r] for r in validated_regimes(plan, moe=moe) if r in errors}
