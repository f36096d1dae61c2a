"""What the mesh search knows of a mesh before it searches its plans: a floor on its model
states (a mesh above HBM is dropped) and a lower bound on its step time (the order it is
searched in, and what prunes it).

    bound_meshes(est, meshes, global_batch, mbs_choices) -> Bounds
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import Estimator
from autoplan.cost.bounds import states_lower_bound, step_lower_bound
from autoplan.plan import Plan
from autoplan.search.space import MeshChoice
from costmodels.memory import GIB

# a mesh's tie-break: (tp, cp, ep, pp, dp, zero, not sp, cp algorithm, ulysses, axis order, precision, etp or −1)
SortKey = tuple[int, int, int, int, int, int, bool, str, int, tuple[str, ...], str, int]


@dataclass(frozen=True)
class Bounded:
    """A mesh whose model states fit, with its step-time lower bound and its tie-break."""

    bound: float
    sort_key: SortKey
    mesh: MeshChoice


@dataclass(frozen=True)
class Bounds:
    meshes: list[Bounded]          # by (bound, sort key)
    pruned_memory: int             # meshes whose model states cannot fit
    least_states_gib: float        # the smallest model-state floor of any mesh (the no-fit message)


def bound_meshes(est: Estimator, meshes: list[MeshChoice], global_batch: int,
                 mbs_choices: tuple[int, ...]) -> Bounds:
    """The meshes whose model states fit (``states_floor``), each with its ``lower_bound``."""
    bounded: list[Bounded] = []
    pruned, least = 0, float("inf")
    for mesh in meshes:
        states = states_floor(est, mesh, global_batch, mbs_choices)
        least = min(least, states)
        if states > est.usable_bytes / GIB:
            pruned += 1
            continue
        bounded.append(Bounded(lower_bound(est, mesh, global_batch, mbs_choices), _mesh_sort_key(mesh), mesh))
    return Bounds(sorted(bounded, key=lambda b: (b.bound, b.sort_key)), pruned, least)


def lower_bound(est: Estimator, mesh: MeshChoice, global_batch: int,
                mbs_choices: tuple[int, ...] = (1, 2, 4, 8)) -> float:
    """A lower bound on the step time of any plan of ``mesh``: the smallest ``step_lower_bound``
    over the micro-batch sizes the search may pick."""
    return min((step_lower_bound(est, plan, global_batch) for plan in _mbs_plans(mesh, global_batch, mbs_choices)),
               default=float("inf"))


def states_floor(est: Estimator, mesh: MeshChoice, global_batch: int,
                 mbs_choices: tuple[int, ...] = (1, 2, 4, 8)) -> float:
    """Model-state GiB per GPU no plan of ``mesh`` can avoid: the smallest ``states_lower_bound``
    over the micro-batch sizes the search may pick (0 when none runs: nothing to bound).  The
    states read the micro-batch size only through whether a step has one micro-batch."""
    plans = {plan.microbatches(global_batch) == 1: plan for plan in _mbs_plans(mesh, global_batch, mbs_choices)}
    return min((states_lower_bound(est, plan, global_batch) / GIB for plan in plans.values()), default=0.0)


def _mbs_plans(mesh: MeshChoice, global_batch: int, mbs_choices: tuple[int, ...]) -> list[Plan]:
    """The mesh's plan at each micro-batch size that divides its local batch (1F1B, no recompute)."""
    return [mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",)) for mbs in mbs_choices
            if (global_batch // mesh.dp) % mbs == 0]


def _mesh_sort_key(mesh: MeshChoice) -> SortKey:
    return (mesh.tp, mesh.cp, mesh.ep, mesh.pp, mesh.dp, mesh.zero, not mesh.sp, mesh.cp_algo, mesh.ulysses, mesh.order,
            mesh.precision, -1 if mesh.etp is None else mesh.etp)
