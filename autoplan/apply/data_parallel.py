"""Data parallelism at the plan's ZeRO level, on the plan's dp axis.

* ``zero=3``: FSDP2 ``fully_shard`` on every block and on the stage, parameters
  resharded after forward (all-gathered again for backward).  Under expert parallelism the
  blocks and the stage shard over every dense data-parallel rank (ep·dp) and each experts
  module is its own unit over the ranks holding the same experts (dp/ep), as torchtitan does.
* ``zero=2``: the same with ``reshard_after_forward=False``: parameters stay
  gathered from forward to backward, gradients are reduce-scattered and the
  optimizer state is sharded.
* ``zero=1``: gradients are all-reduced (averaged) over dp after backward;
  ``ZeroOneOptimizer`` gives each dp rank the optimizer state and the update of
  its share of the parameters, then broadcasts the updated values from their
  owners.  (torch's ``ZeroRedundancyOptimizer`` does the same for plain tensors
  but not for the DTensor parameters of tensor parallelism.)
* ``zero=0``: gradients are all-reduced (averaged) over dp after backward.

The dp gradient average over dp ranks is what a single process computes with
the loss averaged over the whole global batch.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, the tensor itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def grad_of(p: nn.Parameter) -> torch.Tensor | None:
    """The local gradient of ``p``: its fp32 ``main_grad`` under Megatron's engine
    (``distributed_optimizer.MainGrads``), else the local shard of ``.grad``."""
    main = getattr(p, "main_grad", None)
    return main if main is not None else (None if p.grad is None else local(p.grad))


def shard_fsdp(stage: nn.Module, blocks: list[nn.Module], dp_mesh: DeviceMesh, zero: int,
               mixed_precision: bool = False, experts: Sequence[nn.Module] = (),
               expert_mesh: DeviceMesh | None = None) -> None:
    """FSDP2 units: each experts module over ``expert_mesh`` (its ep rank's experts, sharded over
    the ranks holding the same ones, as torchtitan's ``dp_mod_ep`` mesh), then each block and the
    stage (the outside parameters it owns) over ``dp_mesh``.  ``mixed_precision``: torchtitan's
    policy — fp32 sharded parameters, computed in bf16, gradients reduced in fp32 (what
    ``costmodels.memory`` prices for zero 2/3)."""
    reshard = zero >= 3
    kw: dict[str, Any] = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
        if mixed_precision else {}
    for module in experts:
        fully_shard(module, mesh=expert_mesh, reshard_after_forward=reshard, **kw)
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, **kw)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard, **kw)


def settle_tp_gradients(params: Iterable[nn.Parameter]) -> None:
    """Bring DTensor gradients to their parameter's placements (a partial sum is reduced).

    Under sequence parallelism a replicated norm weight gets a partial gradient
    from each sequence shard; this is Megatron's all-reduce of those gradients.
    """
    for p in params:
        g = p.grad
        # ignore[attr-defined]: a parameter with a DTensor gradient is a DTensor
        if isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements):  # type: ignore[attr-defined]
            p.grad = g.redistribute(p.device_mesh, p.placements)  # type: ignore[attr-defined]


def reduce_gradients(params: Iterable[nn.Parameter], group, divisor: int) -> None:
    """All-reduce every gradient's local shard over ``group`` (None: no other rank) and divide by ``divisor``."""
    for p in params:
        if p.grad is None:
            continue
        g = local(p.grad)
        if group is not None:
            dist.all_reduce(g, group=group)
        if divisor > 1:
            g.div_(divisor)


class Optimizers:
    """Several optimizers stepped as one (dense and expert parameters sharded over different groups)."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self) -> None:
        for o in self.parts:
            o.zero_grad()


class ZeroOneOptimizer:
    """ZeRO stage 1 over a dp group: sharded optimizer state and update, replicated parameters.

    Parameters are dealt to dp ranks greedily by size (each to the rank holding the
    fewest elements so far, in parameter order); each rank runs ``make_optimizer``
    on its share; after ``step`` every parameter is broadcast from its owner.
    """

    def __init__(self, params: list[nn.Parameter], make_optimizer: Callable[[list], torch.optim.Optimizer],
                 group, group_ranks: tuple[int, ...]) -> None:
        self.params = params
        self.group, self.group_ranks = group, group_ranks
        load = [0] * len(group_ranks)
        self.owner: list[int] = []
        for p in params:
            i = min(range(len(load)), key=lambda k: (load[k], k))
            self.owner.append(i)
            load[i] += local(p).numel()
        me = group_ranks.index(dist.get_rank())
        mine = [p for p, o in zip(params, self.owner) if o == me]
        self.inner = make_optimizer(mine) if mine else None

    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for p, o in zip(self.params, self.owner):
                dist.broadcast(local(p), src=self.group_ranks[o], group=self.group)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
