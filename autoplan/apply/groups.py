"""torch process groups over sets of mesh axes, and the gradient reductions of a plan.

Gradients are averaged over every rank that computed them from other data (cp, ep, dp), except
over the axes FSDP2 already averages under zero ≥ 2 (a dense parameter's mesh is ep·dp, all of
the dense data-parallel ranks but cp's; an expert parameter's is the dp axis, of size dp/ep):

* a dense parameter: all-reduce over the ``DENSE_DP`` axes (cp, ep, dp) less FSDP's, divided
  by the group size;
* an expert parameter under ep > 1: its gradient already sums every ep rank's tokens (the
  all-to-all's backward), so all-reduce over the ``EXPERT_DP`` axes (cp, dp) less FSDP's and
  divide by the group size times ep; folded (``etp``), over the expert layout's edp group less
  FSDP's, divided by its size times cp·dp/edp (``gradient_reductions``).

Both equal the gradient of the loss averaged over the global batch (every rank's loss is
the mean over its own rows and tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.axes import DENSE_DP, EXPERT_DP, EXPERT_GROUPS, GROUP_AXES
from autoplan.mesh import Mesh
from autoplan.plan import Plan


def axis_groups(plan: Plan, axes: tuple[str, ...], *, expert: bool = False) -> list[tuple[int, ...]]:
    """Every group of ranks differing only in ``axes``, each sorted, ordered by smallest rank; with
    ``expert``, in a folded plan's expert layout (``Mesh.expert``: etp, ep, edp), else the attention one."""
    mesh = _layout(plan, expert)
    out: dict[tuple, list[int]] = {}
    for r in range(mesh.num_ranks):
        key = tuple(c for a, c in sorted(mesh.coords(r).items()) if a not in axes)
        out.setdefault(key, []).append(r)
    return sorted(tuple(g) for g in out.values())


def _layout(plan: Plan, expert: bool) -> Mesh:
    """The rank layout groups are read from: a folded plan's expert mesh for expert groups."""
    mesh = Mesh.of(plan)
    return mesh.expert if expert and mesh.expert is not None else mesh


@dataclass(frozen=True)
class Reduction:
    """All-reduce over ``group`` (None: nothing to reduce) and divide by ``divisor``."""

    group: object | None
    ranks: tuple[int, ...]
    divisor: int


class GroupMaker:
    """Creates (collectively: every rank calls in the same order) and caches axis-set groups.

    ``expert_mesh``: a folded plan's torch mesh of the expert layout (``device_mesh.expert_device_mesh``),
    whose groups the expert groups (``expert=True``) are; None when the plan is not folded."""

    def __init__(self, plan: Plan, mesh: DeviceMesh, rank: int, expert_mesh: DeviceMesh | None = None) -> None:
        self.plan, self.mesh, self.rank, self.expert_mesh = plan, mesh, rank, expert_mesh
        self._made: dict[tuple[tuple[str, ...], bool], tuple[object | None, tuple[int, ...]]] = {}

    def group(self, axes: tuple[str, ...], *, expert: bool = False) -> tuple[object | None, tuple[int, ...]]:
        """(process group or None when it is this rank alone, its ranks) over the axes of size > 1
        (of the expert layout with ``expert`` when the plan is folded)."""
        expert = expert and self.expert_mesh is not None
        sizes = dict(_layout(self.plan, expert).sizes)
        axes = tuple(a for a in axes if sizes[a] > 1)
        if (axes, expert) not in self._made:
            groups = axis_groups(self.plan, axes, expert=expert)
            ranks = next(g for g in groups if self.rank in g)
            if not axes:
                pg = None
            elif len(axes) == 1:
                pg = (self.expert_mesh if expert else self.mesh)[axes[0]].get_group()  # type: ignore[index]
            else:
                pg = None
                for g in groups:
                    made = dist.new_group(list(g))
                    pg = made if self.rank in g else pg
            self._made[(axes, expert)] = (pg, ranks)
        return self._made[(axes, expert)]

    def named(self, name: str) -> tuple[object | None, tuple[int, ...]]:
        """The group of an ``autoplan.axes`` group name (``DENSE_DP``, ``EXPERT_DP``, an axis); the
        expert groups (``EXPERT_GROUPS``) of a folded plan from its expert layout."""
        return self.group(GROUP_AXES[name], expert=name in EXPERT_GROUPS)


def gradient_reductions(plan: Plan, groups: GroupMaker, fsdp: bool) -> tuple[Reduction, Reduction]:
    """(dense, expert) reductions of a plan (see the module docstring).  An expert gradient sums
    every routed token of the ranks it was sent from once, so over its whole ``EXPERT_DP`` group
    (size cp·dp/ep unfolded; folded, the expert layout's edp) it sums the cp·dp data ranks' tokens:
    the divisor is cp·dp over the whole group, scaled by the share of it reduced here (FSDP averages
    over its dp axis itself)."""
    dense_skip = (("ep", "dp") if plan.ep > 1 else ("dp",)) if fsdp else ()
    expert_skip = ("dp",) if fsdp else ()
    whole = len(Mesh.of(plan).group(EXPERT_DP))
    out = []
    for axes, expert, skip in ((GROUP_AXES[DENSE_DP], False, dense_skip), (GROUP_AXES[EXPERT_DP], True, expert_skip)):
        pg, ranks = groups.group(tuple(a for a in axes if a not in skip), expert=expert)
        divisor = len(ranks) if not expert else len(ranks) * plan.cp * plan.dp // whole
        out.append(Reduction(pg if len(ranks) > 1 else None, ranks, divisor))
    return out[0], out[1]
