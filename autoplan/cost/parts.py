"""One graph (a block kind, or the model's pre/post part) under a plan, per micro-batch:
its tp layout's compute and collectives, plus what cp and ep add.

FLOPs (Korthikanti/Megatron): model FLOPs are the GEMM and attention-kernel FLOPs of forward
and backward (``opkinds.is_model_flop_op``) at the plan's micro-batch; recomputation adds the
FLOPs of the forward ops it reruns (``sharding.price.recomputed``, the predicate the ILP's
times and saved bytes read too): all under ``full``, the attention core under ``selective``,
all but every other matmul and the attention kernel under ``op``.

Memory: ``saved_bytes`` (kept from forward to backward; less what the engine's fused kernels do
not keep, ``cost.kernels``, and what an FP8 engine keeps otherwise, ``cost.fp8``) and
``recompute_transient_bytes``, what recomputing the layer
re-materialises during its backward: the saved bytes without recomputation less those kept
under the policy.
"""
from __future__ import annotations

from autoplan.cost import fp8
from autoplan.cost.context import PlanContext
from autoplan.cost.cp import attention_seconds, cp_cost
from autoplan.cost.ep import ep_cost
from autoplan.cost.kernels import kernel_saving_bytes
from autoplan.cost.softmax import with_fallback
from autoplan.cost.tp import BlockLayouts, gemm_precision, overlapped, tp_cost
from autoplan.cost.types import AxisCost, Part
from autoplan.ir import OpGraph
from autoplan.opkinds import is_attention_core, is_expert_param, is_model_flop_op
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding
from autoplan.sharding.price import recomputed


def price_part(ctx: PlanContext, graph_key: str, graph: OpGraph, recompute: str, layouts: BlockLayouts) -> Part:
    """The graph ``graph_key`` under ``ctx.plan`` and the recompute policy ``recompute``, per
    micro-batch; its tp layout from ``layouts``."""
    plan, mesh, prices, kernels = ctx.plan, ctx.mesh, ctx.prices, ctx.options.kernels
    bs = with_fallback(layouts.sharding(graph_key, graph, plan, recompute, mesh), graph, plan, recompute,
                       prices.profile, prices.cluster.gpu.hbm_bw)
    tp = tp_cost(bs, plan)
    attention = attention_seconds(ctx, graph)
    if ctx.options.tp_comm_overlap and plan.sp:
        tp = overlapped(tp, (bs.forward_s - attention[0], bs.backward_s + bs.wgrad_s - attention[1]))
    cp = cp_cost(ctx, graph, attention)
    ep = ep_cost(ctx, graph)
    dense, expert, largest = _param_numels(graph, bs, plan)
    engine, precision = ctx.options.fp8_engine, gemm_precision(graph_key, plan)
    saved = bs.saved_bytes - kernel_saving_bytes(kernels, graph, bs, plan, recompute) + \
        fp8.saved_delta_bytes(graph, bs, plan, precision, recompute, engine)
    unsaved = saved
    if recompute != "none":
        kept = layouts.sharding(graph_key, graph, plan, "none", mesh)
        unsaved = kept.saved_bytes - kernel_saving_bytes(kernels, graph, kept, plan, "none") + \
            fp8.saved_delta_bytes(graph, kept, plan, precision, "none", engine)
    fp8_weights = fp8.weight_numel(graph, bs, plan, precision)
    backward_s = bs.backward_s + (prices.params.recompute - 1.0) * bs.recompute_s   # recompute's uncertain cost
    forward_s, backward_s, wgrad_s = host_bound(prices.profile.host_floor_s, bs, tp, backward_s)
    forward_s, backward_s = forward_s + cp.compute_fwd_s, backward_s + cp.compute_bwd_s
    return Part(
        forward_s=forward_s, backward_s=backward_s, wgrad_s=wgrad_s,
        exposed_fwd_s=tp.exposed_fwd_s + cp.exposed_fwd_s + ep.exposed_fwd_s,
        exposed_bwd_s=tp.exposed_bwd_s + cp.exposed_bwd_s + ep.exposed_bwd_s,
        ep_fwd_s=ep.exposed_fwd_s, ep_bwd_s=ep.exposed_bwd_s,
        saved_bytes=saved, recompute_transient_bytes=max(0.0, unsaved - saved),
        wgrad_held_bytes=bs.wgrad_held_bytes, b_freed_bytes=_freed_at_b(ctx, graph_key, bs, saved),
        dense_numel=dense, expert_numel=expert, largest_param_numel=largest,
        model_flops=sum(n.flops for n in graph.ops() if is_model_flop_op(n)) * plan.mbs,
        recompute_flops=_recompute_flops(graph, recompute) * plan.mbs,
        attention_s=sum(attention), compute_s=forward_s + backward_s + wgrad_s,
        comms=tp.comms + cp.comms + ep.comms, fp8_weight_numel=fp8_weights.numel,
        fp8_gemms=fp8_weights.gemms, ilp_gap=bs.gap)


def _freed_at_b(ctx: PlanContext, graph_key: str, bs: BlockSharding, saved: float) -> float:
    """Of a micro-batch's ``saved`` bytes, what a split backward's B frees (``Part.b_freed_bytes``):
    under Megatron's WeightGradStore (``EstimateOptions.wgrad_store``) all but the weight ops'
    inputs; under torch's pipelining only the post part's loss, above the head (a block's tail
    above its weight ops is read by the next block's, unless it ends the stage)."""
    if ctx.options.wgrad_store:
        return max(0.0, saved - bs.wgrad_input_bytes)
    return bs.b_freed_bytes if graph_key == "@post" else 0.0


def host_bound(host_floor_s: float, bs: BlockSharding, tp: AxisCost, backward_s: float) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient) compute seconds of one micro-batch with the host's
    launch floor (``costmodels.compute``): a phase of N launches (its kernels and its tp
    collectives) lasts max(GPU seconds + exposed tp seconds, N · host_floor_s), the GPU running
    the kernels (collectives included) while the host issues the next ones; the compute share is
    what is left after the exposed collectives.  Backward and weight gradients stretch alike."""
    if host_floor_s <= 0.0:
        return bs.forward_s, backward_s, bs.wgrad_s
    n_fwd = bs.forward_launches + sum(1 for c in tp.comms if c.phase == "forward")
    n_bwd = bs.backward_launches + sum(1 for c in tp.comms if c.phase == "backward")
    forward = max(bs.forward_s, n_fwd * host_floor_s - tp.exposed_fwd_s)
    gpu_bwd = backward_s + bs.wgrad_s
    stretch = max(gpu_bwd, n_bwd * host_floor_s - tp.exposed_bwd_s) / gpu_bwd if gpu_bwd > 0 else 1.0
    return forward, backward_s * stretch, bs.wgrad_s * stretch


def _recompute_flops(graph: OpGraph, recompute: str) -> float:
    """Model FLOPs (GEMM and attention, as MFU counts them) of the forward ops recomputation reruns."""
    return sum(n.flops for n in graph.ops("forward")
               if recomputed(graph, n, recompute) and (is_model_flop_op(n) or is_attention_core(n)))


def _param_numels(graph: OpGraph, bs: BlockSharding, plan: Plan) -> tuple[int, int, int]:
    """(dense, expert, largest) parameters one GPU holds for this graph: tp-sharded, experts
    also /ep; under MoE parallel folding the experts /(etp·ep) whatever the tp layout (Megatron-Core
    splits each expert's GEMMs over the expert-tensor-parallel group); largest: the biggest single
    parameter's local elements."""
    dense = expert = largest = 0
    for n in graph.params():
        pl = bs.param_placements.get(n.param or n.name, "R")
        numel = n.out.numel // (plan.tp if pl.startswith("S(") else 1)  # type: ignore[union-attr]  # a param has its tensor

        if is_expert_param(n) and plan.folded:
            numel = n.out.numel // (plan.expert_tp * plan.ep)  # type: ignore[union-attr]  # a param has its tensor
            expert += numel
        elif is_expert_param(n):
            numel //= plan.ep
            expert += numel
        else:
            dense += numel
        largest = max(largest, numel)
    return dense, expert, largest
