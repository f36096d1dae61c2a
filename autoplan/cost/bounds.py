"""Bounds the search prunes with: no plan of a mesh can be faster, or smaller, than these.

* ``step_lower_bound``: m micro-batches × (F + B + W + exposed per-layer communication of all
  layers, embedding and head, no recompute) / pp — the average pipeline rank's busy time, which
  the makespan cannot beat — plus, under ZeRO-2/3, the per-micro-batch data-parallel traffic
  that compute cannot hide (at the average rank), plus the optimizer step.  With DualPipeV
  possible (pp > 1) the EP all-to-all a pair can hide is left out.
* ``states_lower_bound``: model states of an even share of the parameters under the plan's
  ZeRO stage, plus the fixed reserve.
"""
from __future__ import annotations

from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost import dp, memory
from autoplan.cost.estimator import Estimator
from autoplan.mesh import Mesh
from autoplan.plan import Plan


def _numels(parts) -> tuple[float, float]:
    """(dense, expert) parameters per GPU of every graph, before pipeline cuts."""
    dense = expert = 0.0
    for p, count in parts:
        dense += p.dense_numel * count
        expert += p.expert_numel * count
    return dense, expert


def step_lower_bound(est: Estimator, plan: Plan, global_batch: int) -> float:
    mesh = Mesh.of(plan)
    m = plan.microbatches(global_batch)
    parts = est.counted_parts(plan, mesh)
    work = hideable = 0.0
    for p, count in parts:
        work += count * p.work_s
        hideable += count * (p.ep_fwd_s + p.ep_bwd_s)
    dense, expert = _numels(parts)
    if plan.pp > 1 and hideable:
        work -= hideable
    per_rank_mb = work / plan.pp
    bound = m * per_rank_mb
    if plan.zero >= 2 and est.options.overlap_grad_reduce:
        colls = dp.dp_comms(est.comms, plan, dense / plan.pp, expert / plan.pp, mesh.group(DENSE_DP),
                            mesh.group(EXPERT_DP), m)
        bound += m * max(0.0, dp.per_microbatch_seconds(colls, m) - per_rank_mb)
    return bound + dp.optimizer_seconds(est.comms, (dense + expert) / plan.pp, plan, len(mesh.group(DENSE_DP)))


def states_lower_bound(est: Estimator, plan: Plan) -> float:
    mesh = Mesh.of(plan)
    dense, expert = _numels(est.counted_parts(plan, mesh))
    return memory.states_lower_bound(plan, dense, expert, dense_dp=len(mesh.group(DENSE_DP)),
                                     expert_dp=len(mesh.group(EXPERT_DP)))
