"""Megatron-Core's mixed-precision data parallelism for zero 0/1 (``apply(..., mixed_precision=True)``,
which ``autoplan memcheck`` runs), so that a tracked step holds what a Megatron-LM run holds.

* Parameters are bf16 (Megatron's ``Float16Module``; ``to_bf16``).
* ``MainGrads``: an fp32 gradient per parameter, ``main_grad`` (Megatron-Core
  ``distributed/param_and_grad_buffer.py``; Megatron-LM sets ``accumulate_allreduce_grads_in_fp32``
  under bf16).  Megatron packs them into one contiguous buffer per bucket for its collectives;
  the bytes are the same, and separate tensors keep torch's ``MemTracker`` right on fake tensors
  (an in-place update of a view into a registered storage reaches it as a new storage of the
  whole buffer: 4 B per parameter of phantom temporary per accumulation).  A post-accumulate-grad hook adds
  the bf16 gradient autograd produces into ``main_grad`` and frees it, as Megatron-Core's
  ``DistributedDataParallel._make_backward_post_hook`` does (``param.main_grad.add_(param.grad.data);
  param.grad = None``).  ``zero_grad`` zeroes the buffer; it stays allocated (4 B per parameter).
  The weight half of a split backward assigns ``.grad`` itself, past the hook: inside
  ``split_weight_gradients_folded`` each parameter group's gradients are folded as soon as W
  computes them, as Megatron's weight-gradient GEMM accumulates into ``main_grad``.
* After backward the gradients are averaged over the data-parallel group in place (an all-reduce;
  Megatron reduce-scatters its buffer under the distributed optimizer, which holds the same bytes:
  the buffer is written in place either way).
* ``DistributedOptimizer``: fp32 master weights and AdamW moments of this rank's contiguous
  ``1/d`` range of the buffer (zero=1: Megatron-Core's ``DistributedOptimizer``,
  ``docs/source/api-guide/dist_optimizer.md``: "bf16 param, fp32 grads: 6 + 12/d" bytes per
  parameter; the range is of the parameters laid end to end, as in Megatron's buffer) or of all
  of it (zero=0: ``Float16OptimizerWithFloat16Params``: 18 bytes).  The
  master's gradient is a view of ``main_grad`` (no copy, as Megatron's ``main_grad`` shard).
  After the step the updated values are written back into the bf16 parameters and every piece is
  broadcast from its owner, in place (Megatron all-gathers its bf16 parameter buffer).
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.apply.data_parallel import local


def to_bf16(module: nn.Module) -> None:
    """Every floating-point parameter of ``module`` replaced by its bf16 copy (Megatron's
    ``Float16Module``), a tied one by one copy.  Parameter by parameter rather than
    ``module.to``: on fake tensors ``nn.Module._apply`` swaps tensors, which they refuse."""
    done: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if p.is_floating_point() and p.dtype != torch.bfloat16:
                if id(p) not in done:
                    done[id(p)] = nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
                setattr(sub, name, done[id(p)])


def _accumulate(p: nn.Parameter) -> None:
    """Add ``p.grad`` (a tp partial sum settled first) into ``p.main_grad`` and free it."""
    # ignore[attr-defined]: a parameter with a DTensor gradient is a DTensor; main_grad is set
    # on the parameter by MainGrads
    g = p.grad
    if isinstance(g, DTensor):
        if tuple(g.placements) != tuple(p.placements):  # type: ignore[attr-defined]
            g = g.redistribute(p.device_mesh, p.placements)  # type: ignore[attr-defined]
        g = g.to_local()
    p.main_grad.add_(g)  # type: ignore[attr-defined]
    p.grad = None


@contextlib.contextmanager
def split_weight_gradients_folded(grads: list[MainGrads]) -> Iterator[None]:
    """Inside, the weight half of torch's split backward folds every parameter group's gradients
    into ``main_grad`` (``MainGrads.fold`` of each of ``grads``) as soon as it has computed them.

    torch's ``stage_backward_weight`` (``PipelineStage.backward_weight_one_chunk`` calls it by its
    name in ``torch.distributed.pipelining.stage``) computes the weight gradients one parameter
    group at a time and assigns them to ``.grad`` itself, so no post-accumulate-grad hook sees
    them: left alone, a chunk holds every weight's bf16 gradient at once after each W (2 B per
    parameter of the chunk on top of the fp32 ``main_grad``) and sums the micro-batches in bf16.
    Here torch's function runs one group per call and the group is folded before the next, so a
    W holds one group's bf16 gradients at most, as Megatron-Core's weight-gradient GEMM, which
    accumulates into ``main_grad`` directly, holds none.  Patches that module attribute (private)
    for the context's duration."""
    from torch.distributed.pipelining import stage as stage_module

    original = stage_module.stage_backward_weight

    def per_group(weights, param_groups, retain_graph=False):
        weights = list(weights)
        for group in param_groups:
            original(iter(weights), [group], retain_graph=retain_graph)
            for g in grads:
                g.fold()
        return ()

    stage_module.stage_backward_weight = per_group
    try:
        yield
    finally:
        stage_module.stage_backward_weight = original


class MainGrads:
    """The fp32 gradients of ``params`` (module docstring), filled by backward hooks; the
    parameters laid end to end at ``offsets`` (the distributed optimizer's ranges)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.offsets = list(itertools.accumulate([0] + [local(p).numel() for p in params]))
        for p in params:
            # new_zeros of the parameter: a fake tensor under memcheck's fake mode, on its device
            p.main_grad = local(p).new_zeros(local(p).shape, dtype=torch.float32)  # type: ignore[attr-defined]
            p.register_post_accumulate_grad_hook(_accumulate)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [p.main_grad for p in self.params]  # type: ignore[attr-defined]  # set in __init__

    def fold(self) -> None:
        """Add every gradient left in ``.grad`` into ``main_grad`` and free it: a weight gradient
        assigned without accumulation (torch's split backward, ``stage_backward_weight``)."""
        for p in self.params:
            if p.grad is not None:
                _accumulate(p)

    def pieces(self, lo: int, hi: int):
        """(parameter, flat start, flat end, offset in [lo, hi)) of every parameter overlapping [lo, hi)."""
        for p, a, b in zip(self.params, self.offsets, self.offsets[1:]):
            x, y = max(a, lo), min(b, hi)
            if x < y:
                yield p, x - a, y - a, x - lo

    def average(self, group, divisor: int) -> None:
        """All-reduce every gradient over ``group`` (None: no other rank) and divide by ``divisor``."""
        for g in self.tensors:
            if group is not None:
                dist.all_reduce(g, group=group)
            if divisor > 1:
                g.div_(divisor)

    def zero(self) -> None:
        for p in self.params:
            p.main_grad.zero_()  # type: ignore[attr-defined]  # set in __init__
            p.grad = None


def _piece(p: nn.Parameter, x: int, y: int) -> torch.Tensor:
    """Elements [x, y) of ``p``'s local tensor: the tensor itself when that is all of it (an
    in-place write into a view reaches ``MemTracker`` on fake tensors as a new storage)."""
    t = local(p)
    return t if (x, y) == (0, t.numel()) else t.view(-1)[x:y]


class DistributedOptimizer:
    """fp32 master weights and the optimizer of this rank's range of ``MainGrads``' parameters
    (all of them when ``ranks`` is one rank: zero=0); see the module docstring."""

    def __init__(self, grads: MainGrads, make_optimizer: Callable[[list], torch.optim.Optimizer],
                 group, ranks: tuple[int, ...]) -> None:
        self.grads, self.group, self.ranks = grads, group, ranks
        n, d = grads.offsets[-1], len(ranks)
        per = -(-n // d)
        self.ranges = [(min(n, r * per), min(n, (r + 1) * per)) for r in range(d)]
        me = ranks.index(dist.get_rank()) if d > 1 else 0
        lo, hi = self.ranges[me]
        self.mine = list(grads.pieces(lo, hi))
        self.masters = []      # one per parameter piece, as Megatron's shard masters: the optimizer's
        with torch.no_grad():  # temporaries stay one piece's (a flat master would make them 8 B · N/d)
            for p, x, y, _at in self.mine:
                master = nn.Parameter(local(p).detach().reshape(-1)[x:y].float())
                master.grad = p.main_grad.view(-1)[x:y]
                self.masters.append(master)
        self.inner = make_optimizer(self.masters) if self.masters else None

    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for (p, x, y, _), master in zip(self.mine, self.masters):
                _piece(p, x, y).copy_(master.view(_piece(p, x, y).shape))
            if len(self.ranks) > 1:
                for owner, (a, b) in zip(self.ranks, self.ranges):
                    for p, x, y, _ in self.grads.pieces(a, b):
                        dist.broadcast(_piece(p, x, y), src=owner, group=self.group)

    def zero_grad(self) -> None:
        self.grads.zero()
