"""Activation memory a schedule really holds: the peak, over each rank's own order, of the
bytes of the (micro-batch, virtual stage) forwards still alive.

``peak_live(schedule, pp, m, chunks, stage_bytes)`` walks the per-rank orders of
``schedules.build_orders`` (the ones the simulator runs): an F of virtual stage s adds
``stage_bytes[s]``, the op that finishes that (micro-batch, stage)'s backward — BW, or W
when the schedule splits B and W — frees it (the convention of
``PipelineResult.peak_activations``, whose count this is when every stage weighs 1).
Within an overlapped pair (DualPipeV's F&B) the forward adds before the backward frees.

When the schedule splits the backward, ``held_bytes[s]`` (the input gradients the weight
gradients read, ``ir.OpGraph.wgrad_held_outputs``) is added by the B of (micro-batch, s) and
freed by its W: between them a chunk holds its saved activations and those gradients — less
``freed_bytes[s]``, the part of its saved bytes B frees once it has run (what lies above every
weight op: the loss, ``ir.OpGraph.freed_at_input_grad_nodes``); W frees the rest.  The loss
backward's own buffers, ``loss_bytes[s]`` (non-zero on the last virtual stage), are a moment of
that stage's B (or full BW) before the rest of it: added at its start, the walk's checkpoint, and
freed before B adds the held gradients — B's end no longer holds them.

It returns, per rank, the peak bytes and how many micro-batches of each of the rank's
virtual stages are alive at that moment — what an interleaved rank really holds: Megatron's
warm-up puts more micro-batches on the rank's first chunk than on its last, so the count
of ``peak_activations`` times a mean chunk misprices uneven chunks.

The peak is reached in the warm-up or the first steady period, so a step of m micro-batches
peaks as its shortest simulated equivalent does (``steady.reduced_sizes``); the orders are
built for that size.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costmodels.memo import memo
from costmodels.pipeline.schedules import BW, B, F, W, build_orders, get_spec, shared_orders
from costmodels.pipeline.steady import reduced_sizes


@dataclass(frozen=True)
class LivePeak:
    """One rank's activation peak: bytes, and the alive micro-batches of each virtual stage."""

    bytes: float
    alive: dict[int, int]          # virtual stage -> micro-batches alive at the peak


def _events(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], ...]:
    """Per rank, per action: (stages whose forward it starts, stages whose activations it frees):
    the walk ``_walk`` vectorises, the reference its tests compare with."""
    split = get_spec(schedule).split_backward
    frees = (W,) if split else (BW,)
    out = []
    for acts in build_orders(schedule, p, m, v):
        out.append(tuple((tuple(op[2] for op in act if op[0] == F),
                          tuple(op[2] for op in act if op[0] in frees or (op[0] == BW and split)))
                         for act in acts))
    return tuple(out)


@dataclass(frozen=True)
class _Walk:
    """The walk of ``peak_live`` as arrays, for all ranks at once (rows padded).

    ``code[r, k]``: the k-th byte change of rank r — stage s's forward adds its saved bytes
    (code s), its free subtracts them less what B freed (code S + s); under a split backward its
    B adds the held gradients (code 2S + s), then frees what it frees (code 4S + s), its W frees
    the held gradients (code 3S + s), and a full backward BW also frees what a B would have
    (code 4S + s after its S + s); the last stage's B and BW start with its loss buffers, added
    (code 5S + s) and freed (code 6S + s); padding adds nothing (code 7S);
    ``checks[r, c]``: the position after the last addition of rank r's c-th action that adds,
    after each B's addition, which that B's own free follows, and after each loss addition (the
    only moments live can rise to a new peak; padded with the row's first)."""

    code: np.ndarray         # (ranks, changes) int
    checks: np.ndarray       # (ranks, checkpoints) int


@memo(64, shared=True)
def _walk(schedule: str, p: int, m: int, v: int) -> _Walk:
    """``_Walk`` of the orders with array arithmetic: every op as (rank, action, kind, stage),
    the additions (F: code s, B: 2S + s) before the frees (S + s, W: 3S + s, B: 4S + s) of each
    action, in order (``_events``' walk, change for change, plus the held gradients)."""
    stages = p * v
    split = get_spec(schedule).split_backward
    ops = np.array([(r, a, k, s) for r, acts in enumerate(shared_orders(schedule, p, m, v))
                    for a, act in enumerate(acts) for k, _, s in act], dtype=np.int64).reshape(-1, 4)
    rank, act, kind, stage = ops.T
    start = (kind == F) | ((kind == B) & split)
    free = (kind == BW) | ((kind == W) & split)
    keep = np.flatnonzero(start | free)
    keep = keep[np.lexsort((free[keep], act[keep], rank[keep]))]    # stable: op order within each class
    k, s = kind[keep], stage[keep]
    code = np.select([k == F, k == B, k == W], [s, 2 * stages + s, stages + s], stages + s)
    held_free = (k == W) & split
    extra = np.flatnonzero(held_free)
    if len(extra):                                       # a W frees the saved bytes, then the held gradients
        keep = np.insert(keep, extra + 1, keep[extra])
        code = np.insert(code, extra + 1, 3 * stages + s[extra])
    if split:        # a B adds the held gradients, then frees the loss's bytes; a full BW frees those too
        full = np.zeros(len(code), dtype=bool)
        full[np.flatnonzero(k == BW) + np.searchsorted(extra, np.flatnonzero(k == BW), side="right")] = True
        b_free = np.flatnonzero((code // stages == 2) | full)
        keep = np.insert(keep, b_free + 1, keep[b_free])
        code = np.insert(code, b_free + 1, np.where(full[b_free], code[b_free] + 3 * stages, code[b_free] + 2 * stages))
    row = rank[keep]
    is_start = start[keep] & (code < 4 * stages)
    check = is_start & np.r_[(act[keep][1:] != act[keep][:-1]) | (row[1:] != row[:-1]) | ~is_start[1:], True]
    if split:        # the last stage's B and BW open with the loss buffers: added (a checkpoint), freed
        last = stages - 1
        at = np.flatnonzero(((code == 2 * stages + last) & (kind[keep] == B))
                            | ((code == stages + last) & (kind[keep] == BW)))
        keep = np.insert(keep, np.repeat(at, 2), np.repeat(keep[at], 2))
        code = np.insert(code, np.repeat(at, 2), np.tile([5 * stages + last, 6 * stages + last], len(at)))
        check = np.insert(check, np.repeat(at, 2), np.tile([True, False], len(at)))
        row = rank[keep]
    counts = np.bincount(row, minlength=p)
    col = np.arange(len(keep)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = np.full((p, max(int(counts.max(initial=0)), 1)), 7 * stages, dtype=np.int64)
    out[row, col] = code
    check_rows, check_cols = row[check], col[check]
    per_rank = np.bincount(check_rows, minlength=p)
    first = np.zeros(p, dtype=np.int64)
    starts_at = np.cumsum(per_rank) - per_rank
    has = per_rank > 0
    first[has] = check_cols[starts_at[has]]
    checks = np.repeat(first[:, None], max(int(per_rank.max(initial=0)), 1), axis=1)
    checks[check_rows, np.arange(len(check_rows)) - np.repeat(starts_at, per_rank)] = check_cols
    return _Walk(out, checks)


def peak_live(schedule: str, p: int, m: int, v: int, stage_bytes: Sequence[float],
              held_bytes: Sequence[float] | None = None,
              freed_bytes: Sequence[float] | None = None,
              loss_bytes: Sequence[float] | None = None) -> tuple[LivePeak, ...]:
    """Per pipeline rank, the peak live activation bytes (see the module docstring);
    ``stage_bytes[s]``: one micro-batch's saved bytes of virtual stage s (pp·chunks entries);
    ``held_bytes[s]``: its input gradients kept from B to W, ``freed_bytes[s]``: the part of its
    saved bytes B frees, ``loss_bytes[s]``: the loss buffers at the start of the last stage's B
    or BW (read on the last stage only; split backward only; default none).

    Live bytes are the running sum of each rank's changes in order (``np.cumsum`` adds in
    sequence, so every partial sum is the one a walk adding and subtracting one change at a
    time computes, bit for bit); the peak is the first maximum over the checkpoints, as the
    walk's strict ``live > best`` keeps it, and nothing when no moment holds more than 0."""
    if p == 1:
        return (_one_rank(stage_bytes),)
    return _peaks(schedule, p, min([m, *reduced_sizes(schedule, p, m, v)]), v, tuple(stage_bytes),
                  *(_split(schedule, stage_bytes, x) for x in (held_bytes, freed_bytes, loss_bytes)))


def peak_bytes(schedule: str, p: int, m: int, v: int, stage_bytes: Sequence[float],
               held_bytes: Sequence[float] | None = None,
               freed_bytes: Sequence[float] | None = None,
               loss_bytes: Sequence[float] | None = None) -> tuple[float, ...]:
    """Each rank's ``peak_live`` bytes alone, to the bit (what a memory bound reads; the alive
    counts cost more than the peak)."""
    if p == 1:
        return (_one_rank(stage_bytes).bytes,)
    return _bytes(schedule, p, min([m, *reduced_sizes(schedule, p, m, v)]), v, tuple(stage_bytes),
                  *(_split(schedule, stage_bytes, x) for x in (held_bytes, freed_bytes, loss_bytes)))


def _split(schedule: str, stage_bytes: Sequence[float], split_bytes: Sequence[float] | None) -> tuple[float, ...]:
    """What a walk's B adds or frees (``held_bytes``, ``freed_bytes``, ``loss_bytes``): the given
    bytes under a split backward, else none."""
    if split_bytes is None or not get_spec(schedule).split_backward:
        return (0.0,) * len(stage_bytes)
    return tuple(split_bytes)


@memo(4096)
def _peaks(schedule: str, p: int, size: int, v: int, stage_bytes: tuple[float, ...],
           held_bytes: tuple[float, ...], freed_bytes: tuple[float, ...],
           loss_bytes: tuple[float, ...]) -> tuple[LivePeak, ...]:
    """``peak_live`` of the reduced step, remembered (plans differing only in ZeRO stage or
    schedule knobs that keep the order ask with the same bytes)."""
    walk = _walk(schedule, p, size, v)
    stages = p * v
    at = _at_checks(walk, stage_bytes, held_bytes, freed_bytes, loss_bytes)
    first = np.argmax(at, axis=1)
    best = at[np.arange(p), first]
    # alive at each rank's peak: its forwards so far less its frees so far, per stage
    upto = np.arange(walk.code.shape[1])[None, :] <= walk.checks[np.arange(p), first][:, None]
    row = np.arange(p)[:, None] * stages
    adds = (walk.code < stages) & upto
    frees = (walk.code >= stages) & (walk.code < 2 * stages) & upto
    alive = (np.bincount((row + walk.code)[adds], minlength=p * stages)
             - np.bincount((row + walk.code - stages)[frees], minlength=p * stages)).reshape(p, stages)
    held: list[dict[int, int]] = [{} for _ in range(p)]
    rows, cols = np.nonzero(alive)
    for r, s, n in zip(rows.tolist(), cols.tolist(), alive[rows, cols].tolist()):
        held[r][s] = n
    return tuple(LivePeak(x, held[r]) if x > 0.0 else LivePeak(0.0, {}) for r, x in enumerate(best.tolist()))


@memo(4096)
def _bytes(schedule: str, p: int, size: int, v: int, stage_bytes: tuple[float, ...],
           held_bytes: tuple[float, ...], freed_bytes: tuple[float, ...],
           loss_bytes: tuple[float, ...]) -> tuple[float, ...]:
    """``peak_bytes`` of the reduced step, remembered: ``_peaks``' bytes (the maximum over the
    checkpoints is the value at its first argmax)."""
    best = _at_checks(_walk(schedule, p, size, v), stage_bytes, held_bytes, freed_bytes, loss_bytes).max(axis=1)
    return tuple(x if x > 0.0 else 0.0 for x in best.tolist())


def _at_checks(walk: _Walk, stage_bytes: tuple[float, ...], held_bytes: tuple[float, ...],
               freed_bytes: tuple[float, ...], loss_bytes: tuple[float, ...]) -> np.ndarray:
    """Live bytes of every rank at each of its checkpoints (``_Walk``), (ranks, checkpoints)."""
    b = np.asarray(stage_bytes, dtype=np.float64)
    h = np.asarray(held_bytes, dtype=np.float64)
    f = np.asarray(freed_bytes, dtype=np.float64)
    loss = np.asarray(loss_bytes, dtype=np.float64)
    live = np.cumsum(np.concatenate([b, f - b, h, -h, -f, loss, -loss, [0.0]])[walk.code], axis=1)
    return np.take_along_axis(live, walk.checks, axis=1)


def _one_rank(stage_bytes: Sequence[float]) -> LivePeak:
    """Without a pipeline a micro-batch's forward and backward run back to back: one alive."""
    return LivePeak(float(sum(stage_bytes)), {s: 1 for s in range(len(stage_bytes))})
