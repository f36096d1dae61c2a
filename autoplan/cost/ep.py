"""Expert parallelism: MoE token dispatch and combine on the ep axis.

Each MoE layer sends every token to its top-k experts and back: one all-to-all to dispatch
and one to combine in forward, the same two in backward, each moving
``b·(s/cp)/(tp if SP) · topk · h · e`` bytes per rank (e: the element size of the hidden states
entering the layer as traced, ``context.activation_bytes``, 2 in bf16; with SP each tp rank
dispatches its own sequence shard).  They sit on the critical path, except that
DualPipeV hides one micro-batch's all-to-alls under the other's compute (``pp``).
"""
from __future__ import annotations

from autoplan.axes import Axis
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.types import AxisCost, Comm
from autoplan.ir import OpGraph
from autoplan.opkinds import is_moe

ALL_TO_ALLS_PER_PASS = 2                # dispatch and combine


def ep_cost(ctx: PlanContext, graph: OpGraph) -> AxisCost:
    """Exposed forward/backward seconds of expert parallelism for one graph, and its all-to-alls."""
    plan = ctx.plan
    if plan.ep == 1 or not is_moe(graph):
        return AxisCost()
    topk = ctx.model.topk or 1
    tokens = plan.mbs * ctx.seq_len / plan.cp / (plan.tp if plan.sp else 1)
    nbytes = tokens * topk * ctx.hidden * activation_bytes(graph)
    t = ALL_TO_ALLS_PER_PASS * ctx.prices.collective("all_to_all", nbytes, ctx.mesh.group(Axis.EP.value))
    comms = tuple(Comm(Axis.EP.value, "all_to_all", nbytes, t, t, phase, calls=ALL_TO_ALLS_PER_PASS, purpose="moe")
                  for phase in ("forward", "backward"))
    return AxisCost(t, t, comms)
