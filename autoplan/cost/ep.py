"""Expert parallelism: MoE token dispatch and combine on the ep axis.

Each MoE layer sends every token to its top-k experts and back: one all-to-all to dispatch
and one to combine in forward, the same two in backward, each moving
``b·(s/cp)/(tp if SP) · topk · h · 2`` bytes per rank (bf16 hidden states; with SP each tp
rank dispatches its own sequence shard).  They sit on the critical path, except that
DualPipeV hides one micro-batch's all-to-alls under the other's compute (``pp``).
"""
from __future__ import annotations

from autoplan.axes import Axis
from autoplan.cost.prices import Prices
from autoplan.cost.types import AxisCost, Comm
from autoplan.ir import ModelInfo, OpGraph
from autoplan.mesh import Mesh
from autoplan.opkinds import is_moe
from autoplan.plan import Plan

ACTIVATION_BYTES = 2                    # bf16
ALL_TO_ALLS_PER_PASS = 2                # dispatch and combine


def ep_cost(prices: Prices, info: ModelInfo, seq_len: int, hidden: int, graph: OpGraph, plan: Plan,
            mesh: Mesh) -> AxisCost:
    if plan.ep == 1 or not is_moe(graph):
        return AxisCost()
    topk = info.topk or 1
    tokens = plan.mbs * seq_len / plan.cp / (plan.tp if plan.sp else 1)
    nbytes = tokens * topk * hidden * ACTIVATION_BYTES
    t = ALL_TO_ALLS_PER_PASS * prices.collective("all_to_all", nbytes, mesh.group(Axis.EP.value))
    comms_ = tuple(Comm(Axis.EP.value, "all_to_all", nbytes, t, t, phase, calls=ALL_TO_ALLS_PER_PASS, purpose="moe")
                   for phase in ("forward", "backward"))
    return AxisCost(t, t, comms_)
