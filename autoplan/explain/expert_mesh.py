"""The expert mesh of a folded plan (MoE parallel folding, ``etp``), named for an engineer.

Megatron-Core lays the experts of a pipeline stage out on a second rank layout of the same GPUs
(``autoplan.mesh``: its expert RankGenerator, etp innermost, then ep, then edp, then pp).  For each
of its three group kinds the section names rank 0's group (the first stage's), how many groups
there are, the widest level any of them reaches (``Cluster.span`` over every group: "NVLink",
"IB rail", ...) and, for the per-layer kinds the NVLink rule governs (EP all-to-all; expert TP
when etp > 1, ``autoplan.rules``), whether every group stays inside one NVLink domain.  EDP
carries the expert gradients' reduction once per step, which may cross nodes like DP.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.axes import EXPERT_DP, EXPERT_TP, Axis
from autoplan.mesh import Mesh, ranks_text
from autoplan.plan import Plan
from autoplan.rules import first_crossing_group, per_layer_groups
from topologies.cluster import LEVELS, Cluster

KINDS = ((Axis.EP.value, "EP", "token dispatch/combine all-to-all, every MoE layer"),
         (EXPERT_TP, "ETP", "expert tensor parallelism, every MoE layer"),
         (EXPERT_DP, "EDP", "expert gradient reduction, once per step"))
RULES = {Axis.EP.value: "ep-inside-nvlink", EXPERT_TP: "etp-inside-nvlink"}


@dataclass(frozen=True)
class ExpertGroup:
    """One group kind of the expert mesh."""

    kind: str                       # "EP", "ETP" or "EDP"
    traffic: str                    # what runs on it
    size: int                       # ranks per group
    count: int                      # groups of this kind over the whole job
    first: tuple[int, ...]          # rank 0's group
    level: str                      # the widest span of any group of the kind (Cluster.describe_span)
    rule: str | None                # the NVLink rule that governs it (None: EDP, or a group of one)
    inside_nvlink: bool | None      # every group inside one NVLink domain (None where no rule applies)
    crossing: tuple[int, ...] = ()  # the first group that leaves its domain

    def to_dict(self) -> dict:
        return {"kind": self.kind, "traffic": self.traffic, "size": self.size, "count": self.count,
                "first": list(self.first), "level": self.level, "rule": self.rule,
                "inside_nvlink": self.inside_nvlink, "crossing": list(self.crossing)}

    def text(self) -> str:
        rule = ("" if self.rule is None else
                f"; `{self.rule}` holds" if self.inside_nvlink else
                f"; `{self.rule}` broken: group {ranks_text(self.crossing)} leaves its NVLink domain")
        plural = "s" * (self.count != 1)
        return (f"{self.kind} ({self.traffic}): {self.count} group{plural} of {self.size}, rank 0's is "
                f"{ranks_text(self.first)}; widest level {self.level}{rule}")


def expert_mesh(plan: Plan, cluster: Cluster, experts: int) -> tuple[ExpertGroup, ...]:
    """The expert mesh's groups of a folded ``plan`` (module docstring); () for other plans."""
    mesh = Mesh.of(plan)
    if mesh.expert is None or not experts:
        return ()
    governed = {g.rule: g for g in per_layer_groups(plan, mesh, experts=experts, nvlink_domain=cluster.nvlink_domain)}
    out = []
    for name, kind, traffic in KINDS:
        groups = mesh.groups(name)
        spans = [cluster.span(g) for g in groups]
        widest = max(spans, key=lambda s: LEVELS.index(s.level))
        rule = governed.get(RULES.get(name, ""))
        bad = first_crossing_group(mesh, rule, cluster.nvlink_domain) if rule is not None else None
        level = cluster.describe_span(widest) if len(groups[0]) > 1 else "none (one rank)"
        out.append(ExpertGroup(kind, traffic, len(groups[0]), len(groups), groups[0], level,
                               rule.rule if rule is not None else None,
                               None if rule is None else bad is None, bad or ()))
    return tuple(out)


def expert_mesh_lines(plan: Plan, groups: tuple[ExpertGroup, ...]) -> list[str]:
    """The markdown section (empty for a plan that is not folded)."""
    if not groups:
        return []
    head = (f"MoE parallel folding: attention on tp·cp·dp = {plan.tp}·{plan.cp}·{plan.dp}, experts on "
            f"etp·ep·edp = {plan.expert_tp}·{plan.ep}·{plan.edp} of the same {plan.tp * plan.cp * plan.dp} GPUs "
            "per stage (Megatron-Core's expert rank layout: etp innermost, then ep, then edp).")
    return ["## Expert mesh", "", head, "", *(f"- {g.text()}" for g in groups), ""]
