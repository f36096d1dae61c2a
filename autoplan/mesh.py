"""The device mesh of a Plan: which global ranks form each parallel group.

A plan's ``order`` lists the mesh axes from innermost (consecutive ranks, closest
on the hardware) to outermost.  The ``ep`` axis is carved out of data parallelism:
the layout axes are tp, cp, ep, dp' and pp with ``dp' = dp / ep``, so

* rank = Σ_axis coord[axis] · stride[axis], strides are products of the sizes of
  the axes inside it in ``order``;
* the group of an axis set holds the ranks that differ from a given rank only in
  those axes.

Groups are named by ``autoplan.axes``: one per axis, plus ``DENSE_DP`` (cp, ep, dp: gradients
of non-expert parameters) and ``EXPERT_DP`` (cp, dp: gradients of expert parameters).

**MoE parallel folding** (a plan with ``etp``), as Megatron-Core builds it
(megatron/core/parallel_state.py at NVIDIA/Megatron-LM d98e8a64, ``initialize_model_parallel``):
two layouts of the same ranks in the same ``order``.  The attention mesh (L859-868:
``RankGenerator(tp, ep=1, dp, pp, cp)``) holds tp, cp, dp and pp; the expert mesh (L886-895:
``RankGenerator(tp=etp, ep, dp=edp, pp, cp=1)``) holds etp on the tp axis, ep, edp on the dp
axis and pp, so with pp outermost a stage's tp·cp·dp consecutive ranks are split etp first,
then ep, then edp.  ``Mesh.expert`` is that second mesh; the groups ``ep``, ``EXPERT_DP`` (edp)
and ``EXPERT_TP`` (etp) are read from it (L1357 ``get_ranks('ep')``, L1373 ``'tp'``, L1457
``'dp'`` of the expert generator), every other group from the attention mesh.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import prod

from autoplan.axes import EXPERT_GROUPS, GROUP_AXES
from autoplan.plan import Plan


@dataclass(frozen=True)
class Mesh:
    sizes: tuple[tuple[str, int], ...]    # (axis, size) innermost first
    expert: Mesh | None = None            # folded plans: the expert layout (module docstring)

    @staticmethod
    def of(plan: Plan) -> Mesh:
        size = plan.layout_sizes(expert=False)
        expert = None
        if plan.folded:
            sizes = plan.layout_sizes(expert=True)
            expert = Mesh(tuple((axis, sizes[axis]) for axis in plan.order))
        return Mesh(tuple((axis, size[axis]) for axis in plan.order), expert)

    def for_group(self, name: str) -> Mesh:
        """The layout group ``name`` is read from: the expert mesh for expert groups of a folded plan."""
        return self.expert if self.expert is not None and name in EXPERT_GROUPS else self

    @property
    def num_ranks(self) -> int:
        return prod(s for _, s in self.sizes)

    def size(self, axis: str) -> int:
        return dict(self.sizes)[axis]

    def stride(self, axis: str) -> int:
        stride = 1
        for a, s in self.sizes:
            if a == axis:
                return stride
            stride *= s
        raise KeyError(axis)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for axis, s in self.sizes:
            out[axis] = rank % s
            rank //= s
        return out

    def rank(self, coords: dict[str, int]) -> int:
        return sum(coords.get(a, 0) * self.stride(a) for a, _ in self.sizes)

    def group(self, name: str, rank: int = 0) -> tuple[int, ...]:
        """Ranks of group ``name`` (an axis or a composite group of ``autoplan.axes``) holding ``rank``."""
        return _group(self.for_group(name), name, rank)

    def _group(self, name: str, rank: int) -> tuple[int, ...]:
        axes = GROUP_AXES[name]
        base = self.coords(rank)
        ranks = [0]
        for a in axes:
            ranks = [r + i * self.stride(a) for i in range(self.size(a)) for r in ranks]
        offset = self.rank({a: c for a, c in base.items() if a not in axes})
        return tuple(sorted(offset + r for r in ranks))

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """All groups of kind ``name``, each once, ordered by their smallest rank."""
        seen: set[int]
        out: list[tuple[int, ...]]
        seen, out = set(), []
        for r in range(self.num_ranks):
            if r in seen:
                continue
            g = self.group(name, r)
            seen.update(g)
            out.append(g)
        return out

    def pipeline_rank(self, rank: int) -> int:
        return self.coords(rank)["pp"]


@lru_cache(maxsize=4096)
def _group(mesh: Mesh, name: str, rank: int) -> tuple[int, ...]:
    return mesh._group(name, rank)


def ranks_text(ranks: Sequence[int]) -> str:
    """A group's ranks in a few characters: "0…15" (consecutive), "0, 64, …, 960" (strided)."""
    ranks = list(ranks)
    if len(ranks) == 1:
        return str(ranks[0])
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}…{ranks[-1]}"
    if len(ranks) <= 4:
        return ", ".join(map(str, ranks))
    return f"{ranks[0]}, {ranks[1]}, …, {ranks[-1]}"
