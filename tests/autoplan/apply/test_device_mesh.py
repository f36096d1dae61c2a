"""The torch DeviceMesh of a plan puts every global rank where autoplan.mesh.Mesh puts it."""
from __future__ import annotations

import pytest
import torch

from autoplan.apply.device_mesh import device_mesh, torch_mesh_shape
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import Plan


@pytest.mark.parametrize("text", ["tp=2,pp=2,dp=2", "tp=2,pp=2,dp=4,ep=2,order=pp-tp-cp-ep-dp",
                                  "tp=4,cp=2,dp=2,order=cp-tp-dp-ep-pp"])
def test_row_major_torch_mesh_matches_plan_rank_layout(text):
    plan = Plan.parse(text)
    names, shape = torch_mesh_shape(plan)
    assert names == tuple(reversed(plan.order))
    grid = torch.arange(plan.num_gpus).view(shape)
    mesh = Mesh.of(plan)
    for index in torch.cartesian_prod(*[torch.arange(s) for s in shape]).view(-1, len(shape)).tolist():
        rank = grid[tuple(index)].item()
        assert mesh.coords(rank) == dict(zip(names, index))


def test_world_size_must_match_the_plan(single_rank):
    with pytest.raises(UserError, match="needs tp·cp·pp·dp = 2 ranks, the job has 1"):
        device_mesh(Plan.parse("tp=2"))


def test_apply_rejects_a_mesh_with_another_layout(single_rank):
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan import zoo
    from autoplan.apply import apply
    from autoplan.zoo.spec import parse_spec

    model = zoo.build(parse_spec("llama:layers=2,hidden=32,heads=4,vocab=64"))
    with pytest.raises(UserError, match="does not lay ranks out as the plan"):
        apply(model, Plan.parse("tp=1"), init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)),
              global_batch=1, seq=4)
