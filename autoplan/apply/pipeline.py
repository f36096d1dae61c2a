"""Pipeline stages cut from the model's own forward, and the torch schedule of a plan.

A stage is a deep copy of the whole model in which

* blocks outside the stage are replaced by placeholders: the one just before the
  stage returns the stage's input activation (``_Inject``), the one just after it
  raises ``StageExit`` carrying the stage's output (``_Exit``), the others pass
  their input through (``_Skip``);
* parameters outside the blocks that the stage does not own (``ModelLayout.pre``
  belongs to stage 0, ``post`` to the last stage) become zero-stride zero tensors:
  no memory, not parameters, so the code before the first block still runs
  (cheaply, on dummy token ids) and computes what blocks take besides the residual
  stream (rotary tables, masks).

The stage then runs the model's unmodified ``forward``.  Between stages the
residual stream travels as a plain local tensor (its sequence shard under sp).

Stage placement on pipeline ranks: the loop placement (rank r holds stages
r, r+pp, …) for interleaved schedules, the V placement (rank r holds r and
2·pp−1−r) for zbv and dualpipev.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from autoplan.apply.layout import ModelLayout
from autoplan.apply.outputs import logits_of
from autoplan.apply.schedules import OrderedSchedule
from autoplan.plan import Plan

# plan schedule -> (torch schedule class, several stages per rank)
SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "zb-h1": ScheduleInterleavedZeroBubble,   # one stage per rank: ZB-H1's B/W split, W fills bubbles
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
    "zb-h2": OrderedSchedule,                 # no torch class: the simulator's own order (schedules.py)
}
SINGLE_STAGE = ("gpipe", "1f1b")


class StageExit(Exception):
    """Raised by the placeholder after a stage's last block; carries the stage's output."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("pipeline stage output")
        self.tensor = tensor


class _Skip(nn.Module):
    def forward(self, x, *args, **kwargs):
        return x


class _Inject(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value: torch.Tensor | None = None

    def forward(self, x, *args, **kwargs):
        return self.value


class _Exit(nn.Module):
    def forward(self, x, *args, **kwargs):
        raise StageExit(x)


def stage_bounds(plan: Plan, num_blocks: int) -> list[tuple[int, int]]:
    """[first, end) block range of every virtual stage, in pipeline order."""
    bounds, start = [], 0
    for n in plan.stage_layers(num_blocks):
        bounds.append((start, start + n))
        start += n
    return bounds


def _stub(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Zeros of ``t``'s shape and dtype (or ``dtype``) that take no memory (stride 0)."""
    return torch.zeros((), dtype=dtype or t.dtype, device=t.device).expand(t.shape)


def cut_stage(model: nn.Module, layout: ModelLayout, first: int, end: int, owns_pre: bool,
              owns_post: bool, stub_dtype: torch.dtype | None = None) -> tuple[nn.Module, _Inject | None]:
    """Copy of ``model`` holding blocks [first, end) and the outside parameters the stage owns.
    ``stub_dtype``: the dtype of the stand-ins for the outside parameters it does not own
    (default theirs): the compute dtype, when the stage's parameters are cast to it (the stub
    embedding's output sets the dtype of what the model derives from it, e.g. RoPE's cos/sin)."""
    blocks = model.get_submodule(layout.blocks_path)
    memo: dict[int, object] = {}
    inject = None
    for i, block in enumerate(blocks):  # type: ignore[arg-type,var-annotated]  # the blocks' ModuleList
        if first <= i < end:
            continue
        if i == first - 1:
            memo[id(block)] = inject = _Inject()
        elif i == end:
            memo[id(block)] = _Exit()
        else:
            memo[id(block)] = _Skip()
    stubbed = []
    for name, p in model.named_parameters():
        if layout.block_of(name) is not None:
            continue
        if (owns_pre and name in layout.pre) or (owns_post and name in layout.post):
            continue
        memo[id(p)] = _stub(p, stub_dtype if p.is_floating_point() else None)
        stubbed.append(name)
    stage = copy.deepcopy(model, memo)
    for name in stubbed:                      # stubs are plain attributes, not parameters
        owner, _, attr = name.rpartition(".")
        module = stage.get_submodule(owner)
        value = module._parameters.pop(attr)
        setattr(module, attr, value)
    own = stage.get_submodule(layout.blocks_path)
    # ignore[index, arg-type]: ``own`` is the blocks' ModuleList (get_submodule types it Module)
    if first == 0 and not owns_pre and end > first:
        inject = _inject_before(own[0])  # type: ignore[index]
    if end == len(own) and not owns_post and end > first:  # type: ignore[arg-type]
        own[end - 1].register_forward_hook(_exit_after)  # type: ignore[index]
    return stage, inject


def _inject_before(block: nn.Module) -> _Inject:
    """A stage whose first block is the model's first without owning the embedding (the
    embedding alone is the stage before, as Llama 3 cuts it): no block precedes it to stand in
    for, so a pre-hook hands the block the received stream instead of the (stub) embedding's
    output."""
    inject = _Inject()

    def hook(module, args, kwargs):
        return (inject.value, *args[1:]), kwargs

    block.register_forward_pre_hook(hook, with_kwargs=True)
    return inject


def _exit_after(module: nn.Module, args, output) -> None:
    """The stage's last block is the model's last but the head is the next stage's (Llama 3's
    cut): no block follows to stand in for, so the stream leaves after this block."""
    raise StageExit(output[0] if isinstance(output, tuple) else output)


class StageModule(nn.Module):
    """One pipeline stage: ids (first stage) or the residual stream in, stream or logits out.

    ``seq`` is the tokens per sequence on this rank (S/cp under context parallelism).
    """

    def __init__(self, model: nn.Module, inject: _Inject | None, *, index: int, first: bool, last: bool,
                 seq: int, tp_mesh: DeviceMesh | None, stream: tuple[Placement, ...],
                 keep_vocab_shard: bool = False, positions: torch.Tensor | None = None) -> None:
        super().__init__()
        self.model = model
        self._positions = positions              # [1, seq]: this cp rank's token positions (None: 0..seq-1)
        self.index, self.first, self.last, self.seq = index, first, last, seq
        self._inject = [inject]                  # a list: not registered twice as a submodule
        self._tp_mesh = tp_mesh
        self._stream = stream
        self._keep_vocab_shard = keep_vocab_shard and last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            ids = x
        else:
            ids = torch.zeros(x.shape[0], self.seq, dtype=torch.long, device=x.device)
            if self._tp_mesh is not None:
                x = DTensor.from_local(x, self._tp_mesh, self._stream, run_check=False)
            self._inject[0].value = x  # type: ignore[union-attr]  # a later stage has its injection
        try:
            kwargs = {} if self._positions is None else {"position_ids": self._positions}
            out = logits_of(self.model(ids, **kwargs))
        except StageExit as e:
            out = e.tensor
        finally:
            if not self.first:
                self._inject[0].value = None  # type: ignore[union-attr]
        if isinstance(out, DTensor):
            if self._keep_vocab_shard and out.placements == (Shard(out.dim() - 1),):
                out = out.to_local()          # vocab-parallel logits: the loss reduces over tp
            else:
                out = out.redistribute(out.device_mesh, (Replicate(),) if self.last else self._stream).to_local()
        if out._base is not None:             # zero-bubble schedules detach stage outputs in place
            out = out.clone()
        return out

    def stage_blocks(self, layout: ModelLayout) -> list[nn.Module]:
        """The real blocks this stage holds (not the placeholders)."""
        return [b for b in self.model.get_submodule(layout.blocks_path)  # type: ignore[attr-defined]  # a ModuleList
                if not isinstance(b, (_Skip, _Inject, _Exit))]


def build_schedule(plan: Plan, stages: list[StageModule], pp_group, device: torch.device,
                   microbatches: int, loss_fn):
    """The torch.distributed.pipelining schedule of ``plan`` over this rank's stages."""
    num_stages = plan.pp * plan.vpp
    pipe_stages = [PipelineStage(s, s.index, num_stages, device, group=pp_group) for s in stages]
    cls = SCHEDULE_CLASSES[plan.schedule]
    if cls is OrderedSchedule:
        return cls(pipe_stages, microbatches, loss_fn, plan.schedule)
    if plan.schedule in SINGLE_STAGE:
        return cls(pipe_stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return cls(pipe_stages, n_microbatches=microbatches, loss_fn=loss_fn)
