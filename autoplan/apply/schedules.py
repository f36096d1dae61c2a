"""Pipeline schedules torch has no class for, run from the simulator's own per-rank orders.

``OrderedSchedule`` is a ``torch.distributed.pipelining`` runtime schedule (the custom
action-list support, ``_PipelineScheduleRuntime``) whose compute actions are exactly
``costmodels.pipeline.schedules.build_orders``: F → forward, B → input-gradient backward,
W → weight-gradient backward, BW → full backward; torch adds the sends and receives.  So
the F/B/W order a rank executes is the order the simulator priced (zb-h2).
"""
from __future__ import annotations

from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

from costmodels.pipeline.schedules import BW, B, F, W, build_orders

_KIND = {F: _ComputationType.FORWARD, B: _ComputationType.BACKWARD_INPUT,
         W: _ComputationType.BACKWARD_WEIGHT, BW: _ComputationType.FULL_BACKWARD}


def torch_orders(schedule: str, pp: int, microbatches: int, chunks: int) -> dict[int, list[_Action]]:
    """The simulator's order of ``schedule`` per pipeline rank, as torch pipelining actions."""
    orders = build_orders(schedule, pp, microbatches, chunks)
    out = {}
    for rank, acts in enumerate(orders):
        if any(len(a) != 1 for a in acts):
            raise ValueError(f"{schedule} overlaps F and B pairs; torch runs it with its own class")
        out[rank] = [_Action(stage, _KIND[kind], mb) for ((kind, mb, stage),) in acts]
    return out


def compute_actions(actions) -> list[_Action]:
    """The F/I/W/B actions of a lowered action list (sends and receives dropped)."""
    return [a for a in actions if a is not None and a.computation_type in _KIND.values()]


class OrderedSchedule(_PipelineScheduleRuntime):
    """A torch runtime schedule executing the simulator's per-rank order of ``schedule``."""

    def __init__(self, stages, n_microbatches: int, loss_fn, schedule: str) -> None:
        super().__init__(stages=stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
        pp = stages[0].group_size
        # ignore[assignment]: torch types the attribute dict[int, list[_Action | None]] (list is invariant)
        self.pipeline_order = torch_orders(schedule, pp, n_microbatches, len(stages))  # type: ignore[assignment]
        self._prepare_schedule_with_comms(self.pipeline_order)
