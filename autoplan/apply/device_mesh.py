"""The torch DeviceMesh of a plan, laid out exactly like ``autoplan.mesh.Mesh``.

``Mesh.of(plan)`` numbers ranks with the plan's ``order`` innermost first:
rank = Σ coord[axis] · stride[axis].  A torch ``DeviceMesh`` is row-major (its
last axis varies fastest), so the torch mesh lists the same axes outermost
first, i.e. ``order`` reversed, with the same sizes (``dp`` here is
``dp / ep``, as in ``Mesh``).  Every axis of size 1 is kept so that
``mesh["tp"]``, ``mesh["dp"]``, ``mesh["pp"]`` always exist.

A folded plan (``etp``: MoE parallel folding) has a second torch mesh over the same ranks,
``expert_device_mesh``: the expert layout ``Mesh.of(plan).expert`` (etp on the tp axis, ep, edp on
the dp axis, pp; cp of size 1) in the same ``order``, as Megatron-Core's expert RankGenerator
lays it out; ``device_mesh`` is then the attention layout (tp, cp, dp, pp; ep of size 1).
"""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import Plan


def torch_mesh_shape(plan: Plan, *, expert: bool = False) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Axis names and sizes of the torch mesh, outermost first (``expert``: of a folded plan's expert layout)."""
    mesh = Mesh.of(plan)
    sizes = tuple(reversed(mesh.expert.sizes if expert and mesh.expert is not None else mesh.sizes))
    return tuple(axis for axis, _ in sizes), tuple(size for _, size in sizes)


def device_mesh(plan: Plan, device_type: str = "cpu") -> DeviceMesh:
    """Build the plan's DeviceMesh over the default process group (which must be initialised).

    Global rank r sits at ``Mesh.of(plan).coords(r)`` on every axis.
    """
    world = dist.get_world_size()
    if world != plan.num_gpus:
        raise UserError(f"the plan needs tp·cp·pp·dp = {plan.num_gpus} ranks, the job has {world}",
                        f"launch {plan.num_gpus} processes (--nproc {plan.num_gpus}) or change the plan")
    names, shape = torch_mesh_shape(plan)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def expert_device_mesh(plan: Plan, device_type: str = "cpu") -> DeviceMesh | None:
    """A folded plan's DeviceMesh of the expert layout (module docstring), None for other plans.

    Global rank r sits at ``Mesh.of(plan).expert.coords(r)``: both layouts number ranks innermost
    first, so the torch mesh is again ``arange(world)`` in the reversed order's shape.  Collective:
    every rank calls it."""
    if not plan.folded:
        return None
    names, shape = torch_mesh_shape(plan, expert=True)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)
