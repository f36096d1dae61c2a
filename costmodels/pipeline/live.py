"""Activation memory a schedule really holds: the peak, over each rank's own order, of the
bytes of the (micro-batch, virtual stage) forwards still alive.

``peak_live(schedule, pp, m, chunks, stage_bytes)`` walks the per-rank orders of
``schedules.build_orders`` (the ones the simulator runs): an F of virtual stage s adds
``stage_bytes[s]``, the op that finishes that (micro-batch, stage)'s backward — BW, or W
when the schedule splits B and W — frees it (the convention of
``PipelineResult.peak_activations``, whose count this is when every stage weighs 1).
Within an overlapped pair (DualPipeV's F&B) the forward adds before the backward frees.

It returns, per rank, the peak bytes and how many micro-batches of each of the rank's
virtual stages are alive at that moment — what an interleaved rank really holds: Megatron's
warm-up puts more micro-batches on the rank's first chunk than on its last, so the count
of ``peak_activations`` times a mean chunk misprices uneven chunks.

The peak is reached in the warm-up or the first steady period, so a step of m micro-batches
peaks as its shortest simulated equivalent does (``steady.reduced_sizes``); the orders are
built for that size.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from costmodels.pipeline.schedules import BW, F, W, build_orders, get_spec
from costmodels.pipeline.steady import reduced_sizes


@dataclass(frozen=True)
class LivePeak:
    """One rank's activation peak: bytes, and the alive micro-batches of each virtual stage."""

    bytes: float
    alive: dict[int, int]          # virtual stage -> micro-batches alive at the peak


@lru_cache(maxsize=256)
def _events(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], ...]:
    """Per rank, per action: (stages whose forward it starts, stages whose activations it frees)."""
    split = get_spec(schedule).split_backward
    frees = (W,) if split else (BW,)
    out = []
    for acts in build_orders(schedule, p, m, v):
        out.append(tuple((tuple(op[2] for op in act if op[0] == F),
                          tuple(op[2] for op in act if op[0] in frees or (op[0] == BW and split)))
                         for act in acts))
    return tuple(out)


def peak_live(schedule: str, p: int, m: int, v: int, stage_bytes: Sequence[float]) -> tuple[LivePeak, ...]:
    """Per pipeline rank, the peak live activation bytes (see the module docstring);
    ``stage_bytes[s]``: one micro-batch's saved bytes of virtual stage s (pp·chunks entries)."""
    if p == 1:
        return (_one_rank(stage_bytes),)
    size = min([m, *reduced_sizes(schedule, p, m, v)])
    peaks = []
    for events in _events(schedule, p, size, v):
        alive: dict[int, int] = {}
        live = best = 0.0
        best_alive: dict[int, int] = {}
        for starts, ends in events:
            for s in starts:
                alive[s] = alive.get(s, 0) + 1
                live += stage_bytes[s]
            if live > best:
                best, best_alive = live, dict(alive)
            for s in ends:
                alive[s] -= 1
                live -= stage_bytes[s]
        peaks.append(LivePeak(best, {s: n for s, n in sorted(best_alive.items()) if n}))
    return tuple(peaks)


def _one_rank(stage_bytes: Sequence[float]) -> LivePeak:
    """Without a pipeline a micro-batch's forward and backward run back to back: one alive."""
    return LivePeak(float(sum(stage_bytes)), {s: 1 for s in range(len(stage_bytes))})
