"""Bounds the search prunes with: no plan of a mesh can be faster, or smaller, than these.

* ``step_lower_bound``: m micro-batches × (F + B + W + exposed per-layer communication of all
  layers, embedding and head, no recompute) / pp — the average pipeline rank's busy time, which
  the makespan cannot beat — plus, under ZeRO-2/3, the per-micro-batch data-parallel traffic
  that compute cannot hide (at the average rank), plus the optimizer step.  With DualPipeV
  possible (pp > 1) the EP all-to-all a pair can hide is left out.
* ``states_lower_bound``: model states of an even share of the parameters under the plan's
  ZeRO stage, plus the fixed reserve.
* ``plan_floor``: for one fully specified plan, without simulating its pipeline: a lower
  bound on its step time under any recomputation — ``costmodels.pipeline.bounds
  .makespan_lower_bound`` of its stage times without recomputation, plus the tied-embedding
  sync and the optimizer step (the exposed data-parallel time is ≥ 0), less a relative 1e-9
  for summation order — and whether it fits in HBM as written (``Estimate.fits`` exactly:
  memory reads only the schedule's peak activations, a property of the order).
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost import dp, memory, pp
from autoplan.cost.estimator import Estimator
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.memory import GIB
from costmodels.pipeline.bounds import makespan_lower_bound

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
    if plan.pp > 1 and hideable:
        work -= hideable
    per_rank_mb = work / plan.pp
    bound = m * per_rank_mb
    if plan.zero >= 2 and est.options.overlap_grad_reduce:
        colls = dp.dp_comms(est.comms, plan, dense / plan.pp, expert / plan.pp, mesh.group(DENSE_DP),
                            mesh.group(EXPERT_DP), m, grad_bytes=est.options.grad_reduce_bytes)
        bound += m * max(0.0, dp.per_microbatch_seconds(colls, m) - per_rank_mb)
    return bound + dp.optimizer_seconds(est.comms, (dense + expert) / plan.pp, plan, len(mesh.group(DENSE_DP)))


def states_lower_bound(est: Estimator, plan: Plan) -> float:
    mesh = Mesh.of(plan)
    dense, expert = memory.bag_numels(est.counted_parts(plan, mesh))
    return memory.states_lower_bound(plan, dense, expert, dense_dp=len(mesh.group(DENSE_DP)),
                                     expert_dp=len(mesh.group(EXPERT_DP)))


@dataclass(frozen=True)
class Floor:
    """What ``plan_floor`` knows of a plan before its pipeline is simulated."""

    step_s: float                              # lower bound on the step under this or more recomputation
    fits: bool                                 # Estimate.fits
    memory_gib: float                          # Estimate.memory_gib
    memory_per_stage_gib: tuple[float, ...]    # Estimate.memory_per_stage_gib


def plan_floor(est: Estimator, plan: Plan, global_batch: int) -> Floor:
    """``plan``'s step floor and memory (module docstring); raises the estimate's UserError
    for a plan it would refuse."""
    est.check(plan, global_batch)
    mesh = Mesh.of(plan)
    m = plan.microbatches(global_batch)
    bags = est.stage_bags(plan, mesh)
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    f, b, w = pp.stage_times(bags, pp.wpass_factor(est.comms, schedule))
    act_bytes, p2p, hop, gather = pp.boundary(est.comms, plan, mesh, est.model.sample_positions, est.hidden, schedule)
    pipe = pp.Pipeline(tuple(bags), pp.rank_chunks(plan), tuple(f), tuple(b), tuple(w), act_bytes, p2p, None, 0.0,
                       hop, gather)     # no simulation: memory reads the bags and the schedule's order
    mems = est.rank_memories(plan, mesh, pipe, m)
    totals = [x.total for x in mems]
    makespan = makespan_lower_bound(schedule, plan.pp, m, plan.vpp, f, b, w, p2p)
    fixed = est.embedding_sync(plan, mesh)[1] + est.optimizer_seconds(plan, mesh, [(x.dense_numel, x.expert_numel) for x in mems])
    return Floor((makespan + fixed) * (1 - SUMMATION_MARGIN), max(totals) <= est.usable_bytes,
                 max(totals) / GIB, tuple(t / GIB for t in totals))
