"""Bounds the search prunes with: no plan of a mesh can be faster, or smaller, than these.

* ``step_lower_bound``: m micro-batches × (F + B + W + exposed per-layer communication of all
  layers, embedding and head, no recompute) / pp — the average pipeline rank's busy time, which
  the makespan cannot beat — plus, under ZeRO-2/3, the per-micro-batch data-parallel traffic
  that compute cannot hide (at the average rank), plus the optimizer step.  With DualPipeV
  possible (pp > 1) or combined 1F1B (ep > 1: the search runs it wherever the schedule allows)
  the EP transfers a pair can hide are left out.
* ``states_lower_bound``: model states of an even share of the parameters under the plan's
  ZeRO stage and the runtime's FSDP policy (``memory.states_lower_bound``).
* ``plan_floor``: for one fully specified plan, without simulating its pipeline: a lower
  bound on its step time under any recomputation — ``costmodels.pipeline.bounds
  .makespan_lower_bound`` of its stage times without recomputation (``steady_lower_bound`` under
  optimizer post-validation, where the pipeline costs its steady step), plus the tied-embedding
  sync and the optimizer step (the exposed data-parallel time is ≥ 0), less a relative 1e-9
  for summation order — and whether it fits in HBM as written (``Estimate.fits`` exactly:
  memory reads only the schedule's peak activations, a property of the order).
* ``plan_memory``: that memory alone (what the recompute choice reads for the policies it
  does not price).  The bags, rank groups, live peaks and makespan bound a plan's floor reads
  do not depend on its ZeRO stage (``_Shape``, remembered on its ``cost.memo.ShapeKey``): the
  four ZeRO variants of a mesh share them, and only the model states and the optimizer step are
  priced per variant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost import dp, fsdp, memory, pp
from autoplan.cost.estimator import Estimator
from autoplan.cost.memo import ShapeKey
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.memory import GIB
from costmodels.pipeline.bounds import makespan_lower_bound, steady_lower_bound
from costmodels.pipeline.live import peak_bytes

SUMMATION_MARGIN = 1e-9          # relative: bounds sum in another order than the estimate


def step_lower_bound(est: Estimator, plan: Plan, global_batch: int) -> float:
    mesh = Mesh.of(plan)
    m = plan.microbatches(global_batch)
    parts = est.counted_parts(plan, mesh)
    work = hideable = 0.0
    for p, count in parts:
        work += count * p.work_s
        hideable += count * (p.ep_fwd_s + p.ep_bwd_s)
    dense, expert = memory.bag_numels(parts)
    if (plan.pp > 1 or plan.ep > 1) and hideable:     # DualPipeV, or combined 1F1B (any EP plan may run it)
        work -= hideable
    per_rank_mb = work / plan.pp
    bound = m * per_rank_mb
    ctx = est.context(plan, mesh)
    if plan.zero >= 2 and est.options.overlap_grad_reduce:
        colls = dp.dp_comms(ctx, dense / plan.pp, expert / plan.pp, m)
        bound += m * max(0.0, dp.per_microbatch_seconds(colls, m) - per_rank_mb)
    return bound + dp.optimizer_seconds(ctx, dense / plan.pp, expert / plan.pp)


def states_lower_bound(est: Estimator, plan: Plan, global_batch: int) -> float:
    mesh = Mesh.of(plan)
    dense, expert = memory.bag_numels(est.counted_parts(plan, mesh))
    return memory.states_lower_bound(plan, dense, expert, dense_dp=len(mesh.group(DENSE_DP)),
                                     expert_dp=len(mesh.group(EXPERT_DP)), microbatches=plan.microbatches(global_batch),
                                     pol=fsdp.policy(est.options, plan),
                                     precision=memory.state_precision(est.options.state_precision))


@dataclass(frozen=True)
class Memory:
    """What ``plan_memory`` knows of a plan's memory before its pipeline is simulated."""

    fits: bool                                 # Estimate.fits
    memory_gib: float                          # Estimate.memory_gib
    memory_per_stage_gib: tuple[float, ...]    # Estimate.memory_per_stage_gib
    numels: tuple[tuple[float, float], ...]    # (dense, expert) parameters of each distinct rank bag


@dataclass(frozen=True)
class Floor:
    """What ``plan_floor`` knows of a plan before its pipeline is simulated."""

    step_s: float                              # lower bound on the step under this or more recomputation
    fits: bool                                 # Estimate.fits
    memory_gib: float                          # Estimate.memory_gib
    memory_per_stage_gib: tuple[float, ...]    # Estimate.memory_per_stage_gib


@dataclass(frozen=True)
class _Shape:
    """What a plan's floor reads that its ZeRO stage does not change (``ShapeKey``): the parts,
    bags, stage order and boundary do not read it, only the model states and the optimizer
    step do."""

    mesh: Mesh
    m: int
    bags: tuple[pp.Bag, ...]
    groups: tuple[tuple[pp.Bag, bool], ...]    # memory.rank_groups: distinct rank bags
    of_rank: tuple[int, ...]                   # each rank's group
    live: tuple[float, ...]                    # each rank's peak live activation bytes
    inputs: memory.MemoryInputs                # Estimator.memory_inputs (the FSDP policy reads zero: not here)


def _shape_key(est: Estimator, plan: Plan, global_batch: int, mesh: Mesh) -> ShapeKey:
    """The ``ShapeKey`` of ``plan`` (its mesh ``mesh``) at ``global_batch``."""
    return ShapeKey.of(plan, mesh, plan.microbatches(global_batch), est.model.num_layers)


def _shape(est: Estimator, plan: Plan, key: ShapeKey) -> _Shape:
    """``plan``'s ``_Shape`` (``key`` projected from it), shared by the plans differing from it
    in the ZeRO stage only."""
    def compute() -> _Shape:
        mesh, m = Mesh.of(plan), key.microbatches
        bags = tuple(est.stage_bags(plan, mesh))
        groups, of_rank = memory.rank_groups(bags, pp.rank_chunks(plan))
        schedule = plan.schedule if plan.pp > 1 else "1f1b"
        inputs = est.memory_inputs(plan, mesh, m)
        live = peak_bytes(schedule, plan.pp, m, plan.vpp, *memory.walk_bytes(bags, inputs["loss"]))
        return _Shape(mesh, m, bags, groups, of_rank, live, inputs)
    shape: _Shape = est.memo.shapes.get(key, compute)
    return shape


def plan_memory(est: Estimator, plan: Plan, global_batch: int) -> Memory:
    """``plan``'s memory as its estimate prices it (``Estimator.rank_memories``: the same
    ``memory.bag_states`` per distinct rank bag and ``memory.rank_total`` per rank, so every
    total to the bit); raises the estimate's UserError for a plan it would refuse."""
    est.check(plan, global_batch)
    shape = _shape(est, plan, _shape_key(est, plan, global_batch, Mesh.of(plan)))
    pol = fsdp.policy(est.options, plan)
    states = [memory.bag_states(plan, bag, last, pol=pol, **shape.inputs) for bag, last in shape.groups]
    totals = memory.rank_total(np.array([x.held for x in states])[list(shape.of_rank)].T, np.asarray(shape.live))
    peak = float(totals.max())
    return Memory(peak <= est.usable_bytes, peak / GIB, tuple((totals / GIB).tolist()),
                  tuple((x.dense_numel, x.expert_numel) for x in states))


def plan_floor(est: Estimator, plan: Plan, global_batch: int, mem: Memory | None = None) -> Floor:
    """``plan``'s step floor and memory (module docstring; ``mem``: its ``plan_memory`` when
    known); raises the estimate's UserError for a plan it would refuse."""
    mem = plan_memory(est, plan, global_batch) if mem is None else mem
    key = _shape_key(est, plan, global_batch, Mesh.of(plan))
    shape = _shape(est, plan, key)
    makespan, embed_s = est.memo.makespan_floors.get(key, lambda: _makespan_floor(est, plan, shape))
    fixed = embed_s + est.optimizer_seconds(plan, shape.mesh, list(mem.numels))
    return Floor((makespan + fixed) * (1 - SUMMATION_MARGIN), mem.fits, mem.memory_gib, mem.memory_per_stage_gib)


def _makespan_floor(est: Estimator, plan: Plan, shape: _Shape) -> tuple[float, float]:
    """(``makespan_lower_bound`` of the plan's stage times without the simulator, the tied
    embedding's sync seconds): what the floor reads that the ZeRO stage does not change."""
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    f, b, w = pp.overlapped_stage_times(plan, shape.bags, pp.wpass_factor(est.prices, schedule), shape.m)
    p2p = pp.boundary(est.context(plan, shape.mesh)).seconds
    f_comm, b_comm = pp.pair_comms(schedule, list(shape.bags))
    if est.options.post_validation:     # the pipeline costs its steady step, not its makespan
        floor = steady_lower_bound(schedule, plan.pp, shape.m, plan.vpp, f, b, w, f_comm, b_comm)
    else:
        floor = makespan_lower_bound(schedule, plan.pp, shape.m, plan.vpp, f, b, w, p2p, f_comm, b_comm)
    return floor, est.embedding_sync(plan, shape.mesh)[1]
