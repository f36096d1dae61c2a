"""The audit of one priced plan, optionally against a baseline: what every renderer draws on.

    a = audit(model, cluster, Side("plan", plan, est), baseline=Side("megascale", bplan, best))
    a.to_dict()            # the JSON form (sorted keys when dumped)

Holds the primitive placement tables (``Estimate.primitives``: kind, parallel dim, group size,
span, calls, bytes per call, time and exposed time per step, on the busiest pipeline rank),
the difference per primitive class (kind × dim) and in step time, memory and MFU, the rule
verdicts of both sides (``rules``) and the attention note (why SP/CP were or were not chosen).

By construction of the estimate, the primitives' times add up to ``Estimate.comm_time_s`` and
their exposed parts to ``Estimate.comm_exposed_s``; ``Side.comm_consistent`` checks it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from autoplan.cost import Estimate, Primitive, rounded
from autoplan.cost.evidence import Flag, flags
from autoplan.explain import rules
from autoplan.explain.expert_mesh import ExpertGroup, expert_mesh
from autoplan.explain.precision import PrecisionSaving
from autoplan.explain.rules import Verdict
from autoplan.explain.units import percent, seconds
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

TOLERANCE = 1e-9


@dataclass(frozen=True)
class Side:
    """One contender: a label ("plan", "megascale", ...), its plan and its estimate."""

    label: str
    plan: Plan
    estimate: Estimate

    @property
    def global_batch(self) -> int:
        return self.estimate.microbatches * self.plan.dp * self.plan.mbs

    def comm_consistent(self) -> bool:
        """Per-primitive times add up to the estimate's communication totals."""
        e = self.estimate
        t = sum(p.time_s for p in e.primitives)
        x = sum(p.exposed_s for p in e.primitives)
        return (abs(t - e.comm_time_s) <= TOLERANCE * max(1.0, t)
                and abs(x - e.comm_exposed_s) <= TOLERANCE * max(1.0, x))


@dataclass(frozen=True)
class ClassDiff:
    """One primitive class (a collective kind for one traffic class, ``Primitive.traffic``), summed
    over its rows, on both sides."""

    kind: str
    traffic: str
    plan_time_s: float
    plan_exposed_s: float
    base_time_s: float
    base_exposed_s: float

    @property
    def delta_time_s(self) -> float:
        return self.plan_time_s - self.base_time_s

    @property
    def delta_exposed_s(self) -> float:
        return self.plan_exposed_s - self.base_exposed_s


@dataclass(frozen=True)
class Attention:
    time_share: float          # of the busiest rank's block compute time
    flops_share: float         # of the model FLOPs
    seq: int
    sp: str                    # why SP is on/off
    cp: str                    # why CP is (not) used


@dataclass(frozen=True)
class Audit:
    model: str
    cluster: str
    cluster_text: str
    seq: int
    global_batch: int
    plan: Side
    baseline: Side | None
    verdicts: tuple[Verdict, ...]
    baseline_verdicts: tuple[Verdict, ...]
    classes: tuple[ClassDiff, ...]
    attention: Attention
    evidence: tuple[Flag, ...] = ()             # regimes the plan leans on without a published run
    baseline_evidence: tuple[Flag, ...] = ()
    precision: PrecisionSaving | None = None    # an FP8 plan's step against itself in bf16
    expert_mesh: tuple[ExpertGroup, ...] = ()    # a folded plan's expert groups (``explain.expert_mesh``)

    def to_dict(self) -> dict:
        def side(s: Side | None, vs, flags) -> dict | None:
            if s is None:
                return None
            return {"label": s.label, "plan": s.plan.to_string(), "estimate": json.loads(s.estimate.to_json()),
                    "verdicts": [v.to_dict() for v in vs], "evidence": [f.to_dict() for f in flags]}

        diff = None
        if self.baseline is not None:
            p, b = self.plan.estimate, self.baseline.estimate
            diff = {"step_time_s": p.step_time_s - b.step_time_s, "mfu": p.mfu - b.mfu,
                    "memory_gib": p.memory_gib - b.memory_gib, "comm_time_s": p.comm_time_s - b.comm_time_s,
                    "comm_exposed_s": p.comm_exposed_s - b.comm_exposed_s,
                    "speedup": b.step_time_s / p.step_time_s,
                    "classes": [{"kind": c.kind, "traffic": c.traffic, "plan_time_s": c.plan_time_s,
                                 "plan_exposed_s": c.plan_exposed_s, "baseline_time_s": c.base_time_s,
                                 "baseline_exposed_s": c.base_exposed_s, "delta_time_s": c.delta_time_s,
                                 "delta_exposed_s": c.delta_exposed_s} for c in self.classes]}
        out = {
            "model": self.model, "cluster": self.cluster, "cluster_text": self.cluster_text, "seq": self.seq,
            "global_batch": self.global_batch,
            "plan": side(self.plan, self.verdicts, self.evidence),
            "baseline": side(self.baseline, self.baseline_verdicts, self.baseline_evidence),
            "difference": diff,
            "attention": {"time_share": self.attention.time_share, "flops_share": self.attention.flops_share,
                          "seq": self.attention.seq, "sp": self.attention.sp, "cp": self.attention.cp},
        }
        if self.precision is not None:           # a bf16 plan's audit stays what it was
            out["precision"] = self.precision.to_dict()
        if self.expert_mesh:                     # likewise an unfolded plan's
            out["expert_mesh"] = [g.to_dict() for g in self.expert_mesh]
        return rounded(out)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def audit(model: BlockGraph, cluster: Cluster, plan: Side, baseline: Side | None = None,
          precision: PrecisionSaving | None = None) -> Audit:
    """Audit ``plan`` (and ``baseline``, priced on the same model, cluster and batch; ``precision``:
    an FP8 plan's ``explain.precision.precision_saving``)."""
    base_verdicts = () if baseline is None else tuple(rules.verdicts(model, cluster, baseline.plan, baseline.estimate))
    return Audit(
        model=model.model.name, cluster=cluster.name, cluster_text=cluster.describe(), seq=model.seq_len,
        global_batch=plan.global_batch, plan=plan, baseline=baseline,
        verdicts=tuple(rules.verdicts(model, cluster, plan.plan, plan.estimate)),
        baseline_verdicts=base_verdicts,
        classes=class_diffs(plan.estimate.primitives, baseline.estimate.primitives if baseline else ()),
        attention=attention_note(model, plan.plan, plan.estimate),
        evidence=flags(plan.plan, plan.estimate, moe=bool(model.model.experts)),
        baseline_evidence=() if baseline is None else flags(baseline.plan, baseline.estimate,
                                                            moe=bool(model.model.experts)),
        precision=precision, expert_mesh=expert_mesh(plan.plan, cluster, model.model.experts))


def shown(primitives: tuple[Primitive, ...]) -> list[Primitive]:
    """The primitives worth a table row: groups of one rank (a tp = 1 block's layout still
    lists its collectives, at zero cost) are left out."""
    return [p for p in primitives if p.group_size > 1 or p.time_s > 0]


def class_diffs(plan: tuple[Primitive, ...], base: tuple[Primitive, ...]) -> tuple[ClassDiff, ...]:
    """Per (kind, traffic): summed time and exposed time on each side, in sorted class order."""
    acc: dict[tuple[str, str], list[float]] = {}
    for i, prims in enumerate((plan, base)):
        for p in shown(prims):
            a = acc.setdefault((p.kind, p.traffic), [0.0, 0.0, 0.0, 0.0])
            a[2 * i] += p.time_s
            a[2 * i + 1] += p.exposed_s
    return tuple(ClassDiff(k, d, *v) for (k, d), v in sorted(acc.items()))


def attention_note(model: BlockGraph, plan: Plan, est: Estimate) -> Attention:
    """Attention's share and, in words, why SP and CP are (not) in the plan."""
    share = est.attention_time_share
    if plan.tp == 1:
        sp = "SP off: there is no TP axis to shard the sequence over (tp = 1)."
    elif plan.sp:
        sp = (f"SP on over tp = {plan.tp}: the all-reduce of each TP region becomes a reduce-scatter plus an "
              f"all-gather of the same bytes, and LayerNorm/dropout activations are stored 1/{plan.tp} per GPU.")
    else:
        sp = (f"SP off with tp = {plan.tp}: activations outside attention and MLP are replicated on the "
              f"{plan.tp} TP ranks" + (f"; attention at {percent(share)} of compute is above the "
                                       f"{rules.SP_ATTENTION_SHARE:.0%} trigger" if share > rules.SP_ATTENTION_SHARE
                                       else "") + ".")
    seq = model.seq_len
    trigger = share > rules.CP_ATTENTION_SHARE or seq >= rules.CP_SEQ
    cp_s = sum(p.exposed_s for p in est.primitives if p.axis == "cp")
    if plan.cp > 1:
        fixed = plan.ulysses_ring
        split = ((f", Ulysses {fixed[0]} × ring {fixed[1]}" if fixed else ", the rule's Ulysses × ring split")
                 if plan.cp_algo == "usp" else "")
        cp = (f"CP = {plan.cp} ({plan.cp_algo}{split}): {seq // plan.cp:,} of {seq:,} tokens per rank, "
              f"{seconds(cp_s)} of CP communication exposed per step; "
              + ("triggered by " + ("the sequence length" if seq >= rules.CP_SEQ else "attention's share")
                 if trigger else "not required by the triggers (seq ≥ 32K or attention > 50%)") + ".")
    else:
        cp = ("CP off although " + ("seq ≥ 32K" if seq >= rules.CP_SEQ else "attention > 50%")
              + ": each rank runs attention over the whole sequence." if trigger else
              f"CP off: seq {seq:,} < 32K and attention {percent(share)} ≤ 50% of compute, so sharding the "
              f"sequence would add K/V traffic for little gain.")
    return Attention(time_share=share, flops_share=est.attention_flops_share, seq=seq, sp=sp, cp=cp)


