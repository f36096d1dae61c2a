"""The experimental torch APIs behind autoplan/apply/_torch.py, one test each."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from autoplan.apply._torch import flat_mesh, plain_tensors_are_replicated, register_cpu_attention_sharding


def test_plain_tensors_count_as_replicated_only_inside_the_context(single_rank):
    mesh = init_device_mesh("cpu", (1,))
    d = distribute_tensor(torch.ones(4), mesh, [Replicate()])
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        d + torch.ones(4)
    with plain_tensors_are_replicated():
        out = d + torch.ones(4)
    assert isinstance(out, DTensor) and torch.equal(out.full_tensor(), torch.full((4,), 2.0))
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        d + torch.ones(4)                                   # the context restores the default


@pytest.mark.parametrize("dim", [0, 1])
def test_cpu_flash_attention_runs_on_batch_or_head_sharded_dtensors(single_rank, dim):
    register_cpu_attention_sharding()
    register_cpu_attention_sharding()                       # idempotent
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.square().sum().backward()
    dq, dk, dv = (distribute_tensor(t.detach(), mesh, [Shard(dim)]).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    assert out.placements == (Shard(dim),)
    out.square().sum().backward()
    torch.testing.assert_close(out.full_tensor(), ref)
    torch.testing.assert_close(dq.grad.full_tensor(), q.grad)
    torch.testing.assert_close(dv.grad.full_tensor(), v.grad)


def test_flat_mesh_joins_named_axes_in_the_meshs_order(single_rank):
    """``DeviceMesh._flatten`` behind ``flat_mesh`` (FSDP's dense group ep·dp under expert
    parallelism; the 4- and 8-rank runs of test_expert_parallel.py exercise it at size > 1)."""
    mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "dp", "ep"))
    joined = flat_mesh(mesh, ("ep", "dp"))                  # asked in any order, joined in the mesh's
    assert joined.mesh_dim_names == ("dp_ep",) and joined.size() == 1
    assert flat_mesh(mesh, ("dp",)) is mesh["dp"] or flat_mesh(mesh, ("dp",)).mesh_dim_names == ("dp",)

