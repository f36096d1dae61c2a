"""One graph (a block kind, or the model's pre/post part) under a plan, per micro-batch:
its tp layout's compute and collectives, plus what cp and ep add.

FLOPs (Korthikanti/Megatron): model FLOPs are the GEMM and attention-kernel FLOPs of forward
and backward (``opkinds.is_model_flop_op``) at the plan's micro-batch; recomputation adds the
FLOPs of the forward ops it reruns (``sharding.price.recomputed``, the predicate the ILP's
times and saved bytes read too): all under ``full``, the attention core under ``selective``,
all but every other matmul and the attention kernel under ``op``.

Memory: ``saved_bytes`` (kept from forward to backward; less what the engine's fused kernels do
not keep, ``cost.kernels``, and what an FP8 engine keeps otherwise, ``cost.fp8``; the loss kernel's
bytes, seconds and launches in place of the traced cross entropy's, ``cost.loss``) and
``recompute_transient_bytes``, what recomputing the layer
re-materialises during its backward: the saved bytes without recomputation less those kept
under the policy.
"""
from __future__ import annotations

from typing import NamedTuple

from autoplan.cost import fp8
from autoplan.cost.context import PlanContext
from autoplan.cost.cp import attention_seconds, cp_cost
from autoplan.cost.ep import ep_cost
from autoplan.cost.kernels import kernel_saving_bytes
from autoplan.cost.loss import with_loss_kernel
from autoplan.cost.softmax import with_fallback
from autoplan.cost.tp import BlockLayouts, gemm_precision, overlapped, tp_cost
from autoplan.cost.types import AxisCost, Part
from autoplan.ir import OpGraph
from autoplan.opkinds import is_attention_core, is_model_flop_op
from autoplan.plan import Plan, partial_recompute
from autoplan.routing import is_routed_expert_param, routed_region
from autoplan.sharding import BlockSharding
from autoplan.sharding.price import recomputed


def price_part(ctx: PlanContext, graph_key: str, graph: OpGraph, recompute: str, layouts: BlockLayouts) -> Part:
    """The graph ``graph_key`` under ``ctx.plan`` and the recompute policy ``recompute``, per
    micro-batch; its tp layout from ``layouts``."""
    plan, mesh, prices = ctx.plan, ctx.mesh, ctx.prices
    bs = with_fallback(_sharding(ctx, graph_key, graph, recompute, layouts), graph, plan, recompute,
                       prices.profile, prices.cluster.gpu.hbm_bw)
    tp = tp_cost(bs, plan)
    attention = attention_seconds(ctx, graph)
    if ctx.options.tp_comm_overlap and plan.sp:
        tp = overlapped(tp, (bs.forward_s - attention[0], bs.backward_s + bs.wgrad_s - attention[1]))
    cp = cp_cost(ctx, graph, attention)
    routed = ep_cost(ctx, graph, recompute, layouts.sharding(graph_key, graph, plan, recompute, mesh))
    ep = routed.comm
    dense, expert, largest = _param_numels(graph, bs, plan)
    saved, unsaved = _saved_bytes(ctx, graph_key, graph, recompute, layouts, bs, routed.saved_bytes)
    fp8_weights = fp8.weight_numel(graph, bs, plan, gemm_precision(graph_key, plan))
    backward_s = bs.backward_s + (prices.params.recompute - 1.0) * bs.recompute_s   # recompute's uncertain cost
    backward_s += routed.backward_s + (prices.params.recompute - 1.0) * routed.recompute_s
    phases = Phases(bs.forward_s + routed.forward_s, backward_s, bs.wgrad_s + routed.wgrad_s,
                    tp.exposed_fwd_s + ep.exposed_fwd_s, tp.exposed_bwd_s + ep.exposed_bwd_s)
    floor, launches = prices.profile.host_floor_s, (bs.forward_launches, bs.backward_launches)
    if routed.launches is not None:           # an MoE layer: the engine's launches, no host lead
        floor = max(floor, prices.profile.moe_host_floor_s)
        launches = routed.launches
    forward_s, backward_s, wgrad_s = host_bound(floor, launches, phases, tp)
    forward_s += routed.sync_fwd_s + cp.compute_fwd_s    # the GPU idle at the MoE dispatch's host sync (``ep``)
    backward_s += routed.sync_bwd_s + cp.compute_bwd_s
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


def _saved_bytes(ctx: PlanContext, graph_key: str, graph: OpGraph, recompute: str, layouts: BlockLayouts,
                 bs: BlockSharding, routed_bytes: float) -> tuple[float, float]:
    """(saved, saved without recomputation) bytes of one micro-batch: the traced saved bytes less
    what the engine's fused kernels do not keep (``cost.kernels``), plus what Megatron-Core's MoE
    layer keeps instead of the traced routed ops (``_engine_routed``, ``routed_bytes``) and what an
    FP8 engine keeps otherwise (``cost.fp8``; where the MoE layer's bytes replace the routed ops',
    its GEMMs are left out of the FP8 delta, already priced by the replacement)."""
    plan, kernels, engine = ctx.plan, ctx.options.kernels, ctx.options.fp8_engine
    precision = gemm_precision(graph_key, plan)

    def kept(policy: str, sharding: BlockSharding) -> float:
        extra = _engine_routed(kernels, policy, sharding, routed_bytes)
        skip = routed_region(graph) if _engine_keeps(kernels, policy) else frozenset()
        return sharding.saved_bytes - kernel_saving_bytes(kernels, graph, sharding, plan, policy) + extra + \
            fp8.saved_delta_bytes(graph, sharding, plan, precision, policy, engine, skip)

    saved = kept(recompute, bs)
    if recompute == "none":
        return saved, saved
    return saved, kept("none", _sharding(ctx, graph_key, graph, "none", layouts))


def _sharding(ctx: PlanContext, graph_key: str, graph: OpGraph, recompute: str, layouts: BlockLayouts) -> BlockSharding:
    """The graph's tp layout priced under ``recompute``, the loss kernel's ops in place of the traced
    cross entropy (``cost.loss``)."""
    plan, mesh = ctx.plan, ctx.mesh
    return with_loss_kernel(ctx.options.loss_kernel, layouts.sharding(graph_key, graph, plan, recompute, mesh), graph,
                            lambda: layouts.pricing(graph_key, graph, plan, recompute, mesh))


def _freed_at_b(ctx: PlanContext, graph_key: str, bs: BlockSharding, saved: float) -> float:
    """Of a micro-batch's ``saved`` bytes, what a split backward's B frees (``Part.b_freed_bytes``):
    under Megatron's WeightGradStore (``EstimateOptions.wgrad_store``) all but the weight ops'
    inputs; under torch's pipelining only the post part's loss, above the head (a block's tail
    above its weight ops is read by the next block's, unless it ends the stage)."""
    if ctx.options.wgrad_store:
        return max(0.0, saved - bs.wgrad_input_bytes)
    return bs.b_freed_bytes if graph_key == "@post" else 0.0


class Phases(NamedTuple):
    """One micro-batch's GPU seconds by phase and the communication exposed in forward and backward."""

    forward_s: float
    backward_s: float
    wgrad_s: float
    exposed_fwd_s: float
    exposed_bwd_s: float


def host_bound(host_floor_s: float, launches: tuple[int, int], gpu: Phases, tp: AxisCost) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient) compute seconds of one micro-batch with the host's
    launch floor (``costmodels.compute``): a phase of N launches (its kernels and its tp
    collectives) lasts max(GPU seconds + exposed seconds, N · host_floor_s), the GPU running
    the kernels (collectives included) while the host issues the next ones; the compute share is
    what is left after the exposed collectives.  Backward and weight gradients stretch alike.
    ``launches``: the kernels of forward and of backward (recompute reruns included)."""
    if host_floor_s <= 0.0:
        return gpu.forward_s, gpu.backward_s, gpu.wgrad_s
    n_fwd = launches[0] + sum(1 for c in tp.comms if c.phase == "forward")
    n_bwd = launches[1] + sum(1 for c in tp.comms if c.phase == "backward")
    forward = max(gpu.forward_s, n_fwd * host_floor_s - gpu.exposed_fwd_s)
    gpu_bwd = gpu.backward_s + gpu.wgrad_s
    stretch = max(gpu_bwd, n_bwd * host_floor_s - gpu.exposed_bwd_s) / gpu_bwd if gpu_bwd > 0 else 1.0
    return forward, gpu.backward_s * stretch, gpu.wgrad_s * stretch


def _engine_routed(kernels: str, recompute: str, bs: BlockSharding, engine_bytes: float) -> float:
    """What Megatron-Core's MoE layer keeps beyond the traced routed ops' saved bytes
    (``ep.engine_saved_bytes`` less ``bs.routed_saved_bytes``; negative: it keeps less), under
    ``kernels="megatron-core"`` and a policy that keeps the layer's activations (not ``full``,
    which keeps the block input only, nor torchtitan's ``op``); 0 otherwise."""
    if not _engine_keeps(kernels, recompute):
        return 0.0
    return engine_bytes - bs.routed_saved_bytes


def _engine_keeps(kernels: str, recompute: str) -> bool:
    """Whether Megatron-Core's MoE layer, not the traced routed ops, says what is kept
    (``_engine_routed``)."""
    return kernels == "megatron-core" and recompute not in ("full", "op") and partial_recompute(recompute) is None


def _recompute_flops(graph: OpGraph, recompute: str) -> float:
    """Model FLOPs (GEMM and attention, as MFU counts them) of the forward ops recomputation reruns."""
    return sum(n.flops for n in graph.ops("forward")
               if recomputed(graph, n, recompute) and (is_model_flop_op(n) or is_attention_core(n)))


def _param_numels(graph: OpGraph, bs: BlockSharding, plan: Plan) -> tuple[int, int, int]:
    """(dense, expert, largest) parameters one GPU holds for this graph: dense ones tp-sharded as
    the layout places them; each expert weight split over its expert-tensor-parallel and
    expert-parallel ranks, 1/(etp·ep) (``plan.expert_tp``: etp when folded, tp otherwise, as
    Megatron-Core's default expert_tensor_parallel_size = tp), whatever the tp layout; the router
    is dense (replicated over tp); largest: the biggest single parameter's local elements."""
    dense = expert = largest = 0
    for n in graph.params():
        if is_routed_expert_param(n):
            numel = n.out.numel // (plan.expert_tp * plan.ep)  # type: ignore[union-attr]  # a param has its tensor
            expert += numel
        else:
            pl = bs.param_placements.get(n.param or n.name, "R")
            numel = n.out.numel // (plan.tp if pl.startswith("S(") else 1)  # type: ignore[union-attr]  # a param has its tensor
            dense += numel
        largest = max(largest, numel)
    return dense, expert, largest
