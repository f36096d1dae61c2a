"""The hard rules of a plan, written once: read by the search space, the estimator and the explainer.

**Per-layer groups stay inside one NVLink domain.**  Collectives that run in every layer —
TP/SP (the tp group), the MoE all-to-all (the ep group) and Ulysses' all-to-all (the cp group,
or under USP its Ulysses sub-groups) — may not leave an NVLink domain (ranks
``r // nvlink_domain``, see ``topologies.cluster``).  A group's span is computed from its actual
ranks, for every group of the axis, so a tp=6 plan on 8-GPU domains breaks the rule (its second
group holds ranks 6–11) in the search, the estimate and the explanation alike.  Under MoE
parallel folding the EP groups (and the expert-tensor-parallel groups when etp > 1) are those of
the expert mesh (``Mesh.expert``: Megatron-Core's expert RankGenerator), so EP32 drawn from a
stage of tp2·dp16 ranks spans four 8-GPU domains and breaks the rule.

**The USP split.**  USP runs Ulysses inside the NVLink domain and ring attention across; without
a split in the plan, Ulysses takes the largest divisor u of cp whose sub-groups (u consecutive
members of a cp group) all lie in one domain, wherever tp and the other axes sit, so the rule's
own split never breaks the NVLink rule.

Checking every group is fast: the groups of one axis (stride s, size k) are ``{o + i·s}`` over the
offsets o of the other axes, and a group lies in one domain of D ranks iff ``o mod D + (k−1)·s <
D``; the offsets' residues mod D (at most D of them) are found axis by axis.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.axes import Axis
from autoplan.mesh import Mesh
from autoplan.plan import Plan


@dataclass(frozen=True)
class GroupRule:
    """One per-layer group kind the NVLink rule applies to under a plan."""

    rule: str          # e.g. "tp-inside-nvlink"
    axis: str          # the mesh axis whose groups (or sub-groups) it is
    label: str         # how an engineer names the traffic, e.g. "TP/SP"
    size: int          # ranks per group
    stride: int        # rank distance between neighbours of one group
    expert: bool = False   # its groups are the expert mesh's (a folded plan's ep and etp groups)


def ulysses_and_ring(plan: Plan, mesh: Mesh, nvlink_domain: int) -> tuple[int, int]:
    """(Ulysses degree, ring degree) of the cp axis: the plan's (``cp_algo``, ``ulysses=``), else
    the rule's split (module docstring)."""
    split = plan.ulysses_ring
    if split is not None:
        return split
    return _rule_split(mesh, plan.cp, nvlink_domain)


def _rule_split(mesh: Mesh, cp: int, domain: int) -> tuple[int, int]:
    """The largest u | cp whose Ulysses sub-groups all lie in one domain, and cp/u."""
    stride = mesh.stride(Axis.CP.value)
    for u in sorted((d for d in range(1, cp + 1) if cp % d == 0), reverse=True):
        if u == 1 or groups_inside(mesh, GroupRule("cp-inside-nvlink", Axis.CP.value, "", u, stride), domain):
            return u, cp // u
    return 1, cp


def per_layer_groups(plan: Plan, mesh: Mesh, *, experts: int, nvlink_domain: int) -> list[GroupRule]:
    """The per-layer group kinds of ``plan`` that must stay inside one NVLink domain."""
    out = []
    if plan.tp > 1:
        out.append(GroupRule("tp-inside-nvlink", Axis.TP.value, "TP/SP", plan.tp, mesh.stride("tp")))
    folded = mesh.expert is not None
    experts_mesh = mesh.expert or mesh
    if plan.ep > 1 and experts:
        out.append(GroupRule("ep-inside-nvlink", Axis.EP.value, "EP all-to-all", plan.ep, experts_mesh.stride("ep"),
                             folded))
    if folded and plan.expert_tp > 1 and experts:
        out.append(GroupRule("etp-inside-nvlink", Axis.TP.value, "expert TP", plan.expert_tp,
                             experts_mesh.stride("tp"), True))
    if plan.cp > 1 and plan.cp_algo in ("ulysses", "usp"):
        ulysses, _ = ulysses_and_ring(plan, mesh, nvlink_domain)
        if ulysses > 1:
            out.append(GroupRule("cp-inside-nvlink", Axis.CP.value, "Ulysses all-to-all", ulysses, mesh.stride("cp")))
    return out


def rule_mesh(mesh: Mesh, g: GroupRule) -> Mesh:
    """The layout whose groups ``g`` constrains: the expert mesh for a folded plan's expert groups."""
    return mesh.expert if g.expert and mesh.expert is not None else mesh


def groups_inside(mesh: Mesh, g: GroupRule, domain: int) -> bool:
    """Every group of kind ``g`` lies in one NVLink domain of ``domain`` ranks."""
    mesh = rule_mesh(mesh, g)
    residues = {0}
    for axis, size in mesh.sizes:
        n = size if axis != g.axis else size // g.size        # USP: the ring part of cp is an offset
        step = mesh.stride(axis) * (1 if axis != g.axis else g.size)
        if n > 1:
            residues = {(r + j * step) % domain for r in residues for j in range(min(n, domain))}
    return max(residues) + (g.size - 1) * g.stride < domain


def first_crossing_group(mesh: Mesh, g: GroupRule, domain: int) -> tuple[int, ...] | None:
    """The ranks of the group of kind ``g`` with the smallest ranks that leaves its domain (sub-groups
    of a whole group are not in rank order across groups: every one is looked at)."""
    if groups_inside(mesh, g, domain):
        return None
    mesh = rule_mesh(mesh, g)
    crossing = (full[i:i + g.size] for full in mesh.groups(g.axis) for i in range(0, len(full), g.size))
    return min((r for r in crossing if r[0] // domain != r[-1] // domain), default=None)


def nvlink_breaks(plan: Plan, mesh: Mesh, *, experts: int,
                  nvlink_domain: int) -> list[tuple[GroupRule, tuple[int, ...]]]:
    """(rule, first offending group) for every per-layer group kind of ``plan`` (laid out as ``mesh``)
    that leaves the NVLink domain."""
    out = []
    for g in per_layer_groups(plan, mesh, experts=experts, nvlink_domain=nvlink_domain):
        bad = first_crossing_group(mesh, g, nvlink_domain)
        if bad is not None:
            out.append((g, bad))
    return out


def respects_nvlink(plan: Plan, *, experts: int, nvlink_domain: int) -> bool:
    """Every per-layer group of ``plan`` lies inside one NVLink domain (what the search enforces)."""
    mesh = Mesh.of(plan)
    return all(groups_inside(mesh, g, nvlink_domain)
               for g in per_layer_groups(plan, mesh, experts=experts, nvlink_domain=nvlink_domain))
