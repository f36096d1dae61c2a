"""The routed experts of an MoE layer and their expert parallelism, priced as engines run them.

The block ILP leaves the routed-expert region of a MoE block (router, dispatch, experts, combine;
``autoplan.routing``) at one fixed layout and prices none of it; this module does, per
micro-batch and GPU, as Megatron-Core runs an MoE layer (torchtitan's is the same with its own
kernels):

* each GPU routes its own T = mbs·s/(cp·tp) tokens (the sequence-parallel shard; Megatron-Core
  requires SP with TP and EP; without SP the tp ranks hold the same tokens, each routes 1/tp of
  them and the layer's output is all-gathered over tp, reduce-scattered in backward): the
  **router** GEMM [T, h]×[h, E], softmax and top-k;
* **permute**: the T·k (token, expert) rows gathered in expert order (a memory-bound copy, as
  is **unpermute**: the k rows of a token weighted and summed back);
* **dispatch** to the ranks of the EP group holding the experts and **combine** back, forward
  and (the other way) backward: an NCCL all-to-all or DeepEP's hierarchical transfer
  (``plan.dispatcher``, ``costmodels.dispatch``), on the EP group's real ranks;
* under expert tensor parallelism (``plan.expert_tp`` > 1) the received rows are all-gathered
  over the ETP group before the expert GEMMs and reduce-scattered after them;
* the **grouped GEMMs** of the E/ep local experts, each on its rows: T·k·ep·etp/E tokens per
  expert, its ffn dim split over etp; backward an input-gradient and a weight-gradient GEMM per
  forward one, the weight gradient accumulated into the fp32 main gradient (Megatron-Core's
  gradient-accumulation fusion: 8 bytes read and written per weight per micro-batch).  Each is
  priced as its own (tokens per expert, N, K) GEMM (``costmodels.compute``), so its efficiency
  falls as tokens per expert shrink (the ``gemm_half_dim`` curve on M), and the weights are
  read once per micro-batch whatever the tokens: fewer tokens per expert, more weight traffic
  per FLOP;
* the activation (SwiGLU) between them, memory-bound.

**Load**: the slowest rank sets the layer's pace (a combine waits for every rank's experts),
so the grouped GEMMs, the activation and the transfers are priced at the busiest rank's rows:
``costmodels.dispatch.busiest_load``, max/mean = 1 + z(ep)·√((1 − 1/ep)/(T·k)) under the
balanced routing the published MoE benchmarks force (``--moe-router-force-load-balancing``);
an aux-loss-free dropless run is less even and is not what the planner prices.

**Recomputation**: under ``full`` the region's forward, transfers included, runs again in
backward; ``selective`` (the attention core) and ``op`` leave it alone.

**Exposure**: every transfer sits on its layer's critical path, except that a merged
forward-backward pair hides one micro-batch's transfers under the other's compute: DualPipeV
(``pp.pair_comms``) and Megatron-Core's combined 1F1B (``plan.ep_overlap``, ``hide_paired``).
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.axes import EXPERT_TP, Axis
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.types import AxisCost, Comm
from autoplan.ir import OpGraph, OpNode
from autoplan.routing import is_routed_expert_param, routed_region
from autoplan.sharding import BlockSharding
from autoplan.sharding.price import recomputed
from costmodels import dispatch
from costmodels.precision import gemm_cast_bytes, is_low_precision

TRANSFERS_PER_PASS = 2                  # dispatch and combine
MAIN_GRAD_BYTES = 8                     # fp32 main gradient read and written per weight (accumulation fusion)
ROUTER_STAT_BYTES = 4                   # fp32 router logits / probabilities, per (token, expert)
ROUTER_PASSES = 3                       # softmax, top-k, the aux-loss statistics: passes over [T, E]


@dataclass(frozen=True)
class ExpertShapes:
    """What the trace says of one MoE layer's routed experts: each forward expert GEMM as its
    weight's (N, K) per row (a row of K in, N out; the dim that is not the residual width is the
    ffn one, which expert tensor parallelism splits) and the expert count E."""

    gemms: tuple[tuple[int, int], ...]
    experts: int


@dataclass(frozen=True)
class RoutedCost:
    """One graph's routed experts per micro-batch: compute seconds by phase and the transfers."""

    forward_s: float = 0.0
    backward_s: float = 0.0              # input gradients, and the rerun forward under full recompute
    wgrad_s: float = 0.0
    recompute_s: float = 0.0             # of backward_s
    comm: AxisCost = AxisCost()          # exposed transfers and their collectives
    launches: tuple[int, int] | None = None   # the MoE layer's kernel launches, forward and backward
    sync_fwd_s: float = 0.0              # GPU idle waiting on the host at each transfer: exposed, never hidden
    sync_bwd_s: float = 0.0
    saved_bytes: float = 0.0             # activations Megatron-Core's MoE layer keeps (``engine_saved_bytes``)


def expert_shapes(graph: OpGraph) -> ExpertShapes | None:
    """The graph's routed experts (``ExpertShapes``), None without any; remembered on the graph."""
    if "_expert_shapes" not in graph.__dict__:
        object.__setattr__(graph, "_expert_shapes", _expert_shapes(graph))
    shapes: ExpertShapes | None = graph.__dict__["_expert_shapes"]
    return shapes


def _expert_shapes(graph: OpGraph) -> ExpertShapes | None:
    region = routed_region(graph)
    if not region:
        return None
    experts = next(n.out for n in graph.params() if is_routed_expert_param(n))
    count = experts.shape[experts.dim_roles.index("expert")]  # type: ignore[union-attr]  # a param has its tensor
    gemms = tuple((n.gemm[1], n.gemm[2]) for n in graph.ops("forward")
                  if n.name in region and n.gemm is not None and _reads_expert(graph, n))
    return ExpertShapes(gemms, count)


def _reads_expert(graph: OpGraph, n: OpNode) -> bool:
    """Whether ``n`` reads an expert weight, directly or through views."""
    todo = list(n.inputs)
    while todo:
        src = graph.node(todo.pop().node)
        if src.op == "placeholder":
            if is_routed_expert_param(src):
                return True
        elif src.is_view:
            todo += src.inputs
    return False


def routed_tokens(ctx: PlanContext) -> float:
    """Tokens one GPU routes per micro-batch: its sequence-parallel shard, mbs·s/(cp·tp)."""
    plan = ctx.plan
    return plan.mbs * ctx.seq_len / plan.cp / plan.tp


def ep_cost(ctx: PlanContext, graph: OpGraph, recompute: str = "none", bs: BlockSharding | None = None) -> RoutedCost:
    """The routed experts of ``graph`` under ``ctx.plan`` and ``recompute``, per micro-batch and
    GPU (module docstring), with the layer's launches (``engine_launches``; ``bs``: the block's
    priced tp layout, whose launches count the rest of the layer); nothing for a graph without
    experts."""
    shapes = expert_shapes(graph)
    if shapes is None:
        return RoutedCost()
    plan, e = ctx.plan, activation_bytes(graph)
    k = ctx.model.topk or 1
    tokens = routed_tokens(ctx)
    load = dispatch.busiest_load(tokens * k, plan.ep)
    rows = tokens * k * load                         # rows this (the busiest) rank's experts run
    fwd, dgrad, wgrad = _grouped_gemms(ctx, shapes, rows, e)
    memory = _memory_seconds(ctx, shapes, tokens, rows, e)
    router = _router_seconds(ctx, shapes, tokens, e)
    forward = fwd + memory + router[0]
    backward = dgrad + memory + router[1]
    comms = _transfers(ctx, shapes, tokens, load, e)
    rerun = recompute == "full"
    fwd_s = sum(c.seconds for c in comms if c.phase == "forward")
    bwd_s = sum(c.seconds for c in comms if c.phase == "backward") + (fwd_s if rerun else 0.0)
    syncs = ctx.prices.profile.moe_sync_s if plan.ep > 1 else 0.0
    if rerun:
        comms += tuple(Comm(c.axis, c.kind, c.nbytes, c.seconds, c.exposed_s, "backward", c.calls,
                            c.purpose + " [recompute]", c.ranks) for c in comms if c.phase == "forward")
    launches = engine_launches(graph, shapes, plan.ep, recompute, bs) if bs is not None else None
    return RoutedCost(forward, backward + (forward if rerun else 0.0), wgrad + router[2],
                      forward if rerun else 0.0, AxisCost(fwd_s, bwd_s, comms), launches,
                      syncs, syncs if rerun else 0.0, engine_saved_bytes(ctx, shapes, tokens, rows, e))


def engine_saved_bytes(ctx: PlanContext, shapes: ExpertShapes, tokens: float, rows: float, e: float) -> float:
    """Activations Megatron-Core's MoE layer keeps for backward, one micro-batch (no recomputation):
    the router's fp32 probabilities [T, E]; per routed row (``rows``, the busiest rank's) its
    permuted hidden state, the first expert GEMM's input ([rows·etp, h] after the ETP gather), that
    GEMM's output (the fused SwiGLU's input, [rows·etp, up/etp]), the second GEMM's input
    ([rows·etp, down/etp]) and its fp32 routing probability (applied in the activation since
    Megatron-Core 0.13, so unpermute keeps nothing).  The traced ops of a static-capacity dispatch
    keep more copies (``kernels="eager"`` prices those: what autoplan's own runtime runs)."""
    h, etp = ctx.hidden, ctx.plan.expert_tp
    up = sum(n for n, k in shapes.gemms if k == h)
    down = sum(k for n, k in shapes.gemms if n == h and k != h)
    return tokens * shapes.experts * ROUTER_STAT_BYTES + rows * ((etp * h + up + down) * e + ROUTER_STAT_BYTES)


ROUTED_LAUNCHES = 20
"""Kernels of the routed region per pass besides the expert GEMMs, as Megatron-Core launches
them: the router GEMM, softmax, top-k and the aux-loss statistics, permute, the dispatch
(layout, counts, transfer), the activation, the combine and unpermute."""


def engine_launches(graph: OpGraph, shapes: ExpertShapes, ep: int, recompute: str,
                    bs: BlockSharding) -> tuple[int, int]:
    """(forward, backward) kernel launches of an MoE layer as the engine runs it: the traced
    launches outside the routed region (``bs``'s counts less the region's), plus the region's
    ``ROUTED_LAUNCHES`` and one GEMM per local expert per expert GEMM (Transformer Engine's
    GroupedLinear runs a cuBLAS GEMM per expert), twice in backward (input and weight
    gradients); under full recomputation the forward's again in backward."""
    region = routed_region(graph)
    traced = [0, 0]
    for n in graph.ops():
        if n.name in region and not n.is_view:
            traced[n.phase != "forward"] += 1
            traced[1] += n.phase == "forward" and recomputed(graph, n, recompute)
    gemms = len(shapes.gemms) * max(1, shapes.experts // ep)
    fwd = bs.forward_launches - traced[0] + ROUTED_LAUNCHES + gemms
    bwd = bs.backward_launches - traced[1] + ROUTED_LAUNCHES + 2 * gemms + (fwd if recompute == "full" else 0)
    return fwd, bwd


def _grouped_gemms(ctx: PlanContext, shapes: ExpertShapes, rows: float, e: float) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the local experts' grouped GEMMs on
    ``rows`` routed rows: E/ep experts, each on rows·etp·ep/E tokens with its ffn dim split over
    etp (the dim that is not the hidden size)."""
    plan, prices = ctx.plan, ctx.prices
    etp = plan.expert_tp
    local = shapes.experts / plan.ep
    m = max(rows * etp / local, 1.0)                # tokens per local expert, the ETP gather's included
    low = is_low_precision(plan.precision)
    kind = "gemm_fp8" if low else "gemm"
    fwd = dgrad = wgrad = 0.0
    for n, kk in shapes.gemms:
        n_, k_ = (n / etp, kk) if kk == ctx.hidden else (n, kk / etp)
        flops = 2.0 * m * n_ * k_
        cast = ctx.prices.op_seconds("cast", 0.0, gemm_cast_bytes(plan.precision, m, k_, True), None) if low else 0.0
        fwd += prices.op_seconds(kind, flops, (m * k_ + k_ * n_ + m * n_) * e, (m, n_, k_)) + cast
        cast = ctx.prices.op_seconds("cast", 0.0, gemm_cast_bytes(plan.precision, m, n_, True), None) if low else 0.0
        dgrad += prices.op_seconds(kind, flops, (m * n_ + n_ * k_ + m * k_) * e, (m, k_, n_)) + cast
        wgrad += prices.op_seconds(kind, flops, (m * k_ + m * n_) * e + k_ * n_ * MAIN_GRAD_BYTES, (k_, n_, m))
    return fwd * local, dgrad * local, wgrad * local


def _memory_seconds(ctx: PlanContext, shapes: ExpertShapes, tokens: float, rows: float, e: float) -> float:
    """Seconds of one pass (forward, or backward: the same traffic) of the memory-bound ops:
    permute (T·k rows gathered), unpermute (k rows weighted and summed per token) and the
    activation between the expert GEMMs (a GLU's gate and up in, the product out; backward the
    other way)."""
    h = ctx.hidden
    up = sum(n for n, k in shapes.gemms if k == h)           # widths the up-projections write
    down = sum(k for n, k in shapes.gemms if n == h and k != h)
    k = ctx.model.topk or 1
    permute = 2.0 * tokens * k * h * e + (tokens * k + tokens) * h * e
    act = rows * (up + down) * e                             # rows·etp tokens, each f/etp wide
    return ctx.prices.op_seconds("memory", 0.0, permute + act, None)


def _router_seconds(ctx: PlanContext, shapes: ExpertShapes, tokens: float, e: float) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the router: its GEMM [T, h]×[h, E]
    and its passes over the [T, E] scores in fp32."""
    prices, h, n = ctx.prices, ctx.hidden, shapes.experts
    flops = 2.0 * tokens * h * n
    stats = prices.op_seconds("memory", 0.0, ROUTER_PASSES * tokens * n * ROUTER_STAT_BYTES, None)
    return (prices.op_seconds("gemm", flops, (tokens * h + h * n + tokens * n) * e, (tokens, n, h)) + stats,
            prices.op_seconds("gemm", flops, (tokens * n + h * n + tokens * h) * e, (tokens, h, n)) + stats,
            prices.op_seconds("gemm", flops, (tokens * h + tokens * n) * e, (h, n, tokens)))


def _transfers(ctx: PlanContext, shapes: ExpertShapes, tokens: float, load: float, e: float) -> tuple[Comm, ...]:
    """The layer's dispatch and combine (forward, then backward the other way) and, under expert
    tensor parallelism, the all-gather and reduce-scatter of the received rows over the ETP group."""
    plan, mesh = ctx.plan, ctx.mesh
    k = ctx.model.topk or 1
    out: list[Comm] = []
    if plan.ep > 1:
        ranks = mesh.group(Axis.EP.value)
        nbytes, seconds = dispatch_seconds(ctx, shapes, ranks, tokens, k, load, e)
        purpose = f"moe dispatch+combine ({plan.dispatcher})"
        both = TRANSFERS_PER_PASS * seconds
        out += [Comm(Axis.EP.value, "all_to_all", nbytes, both, both, phase, TRANSFERS_PER_PASS, purpose)
                for phase in ("forward", "backward")]
    if plan.tp > 1 and not plan.sp:
        ranks = mesh.group(Axis.TP.value)
        whole = tokens * plan.tp * ctx.hidden * e
        ag = ctx.prices.collective("all_gather", whole, ranks)
        rs = ctx.prices.collective("reduce_scatter", whole, ranks)
        out += [Comm(Axis.TP.value, "all_gather", whole, ag, ag, "forward", 1, "moe output (no SP)"),
                Comm(Axis.TP.value, "reduce_scatter", whole, rs, rs, "backward", 1, "moe output (no SP)")]
    if plan.expert_tp > 1:
        ranks = mesh.group(EXPERT_TP)
        gathered = tokens * k * load * plan.expert_tp * ctx.hidden * e
        ag = ctx.prices.collective("all_gather", gathered, ranks)
        rs = ctx.prices.collective("reduce_scatter", gathered, ranks)
        for phase in ("forward", "backward"):
            out += [Comm(Axis.TP.value, "all_gather", gathered, ag, ag, phase, 1, "expert tp", ranks),
                    Comm(Axis.TP.value, "reduce_scatter", gathered, rs, rs, phase, 1, "expert tp", ranks)]
    return tuple(out)


def dispatch_seconds(ctx: PlanContext, shapes: ExpertShapes, ranks: tuple[int, ...], tokens: float, k: int,
                     load: float, e: float) -> tuple[float, float]:
    """(bytes one rank sends, seconds) of one dispatch (or combine) of ``tokens`` tokens over the EP
    group ``ranks``: the all-to-all of T·k rows, or the hierarchical transfer (``costmodels.dispatch``),
    at the busiest rank's ``load``."""
    plan, model, row = ctx.plan, ctx.model, ctx.hidden * e
    if plan.dispatcher == "alltoall":
        nbytes = tokens * k * row * load
        return nbytes, ctx.prices.collective("all_to_all", nbytes, ranks)
    span = ctx.prices.span(ranks)
    groups, topk_groups = model.expert_groups, model.topk_groups
    network, nvlink = dispatch.hierarchical_bytes(tokens * load, row, k, shapes.experts, plan.ep, span,
                                                  groups, topk_groups)
    return network + nvlink, dispatch.hierarchical_seconds(network, nvlink, span, ctx.prices.cluster)


COMM_SM_SHARE = 20 / 132
"""Share of the SMs a running dispatch or combine takes from the compute it overlaps: Megatron-Core
gives DeepEP 20 SMs (``--moe-deepep-num-sms``, default 20) of an H100's 132; an NCCL all-to-all's
channels take about as many."""


def paired_fraction(schedule: str, pp: int, vpp: int, m: int) -> float:
    """Share of a rank's forwards that combined 1F1B merges with a backward of another
    micro-batch: all but the warm-up forwards (and the first, which has no backward to pair
    with) of pipeline rank 0, the rank with the most warm-up: Megatron's interleaved warm-up
    min(2·(pp−1) + (vpp−1)·g, m·vpp) with g = pp micro-batches per group
    (``costmodels.pipeline.schedules.interleaved_orders``), 1F1B's pp − 1."""
    total = m * vpp
    cycle = 2 * (pp - 1) + (vpp - 1) * min(pp, m) if schedule == "interleaved" else pp - 1
    warmup = min(cycle, total)
    return max(0, total - warmup - 1) / total


def hide_paired(f: list[float], b: list[float], f_comm: list[float], b_comm: list[float],
                paired: float) -> tuple[list[float], list[float]]:
    """Per virtual stage F and B under combined 1F1B (``plan.ep_overlap``): a ``paired`` share of
    the forwards runs merged with a backward, the pair lasting max(its compute + the SMs its
    transfers take, its transfers) instead of their sum (DualPipeV's pair, ``costmodels.pipeline``,
    with the transfers' SM share ``COMM_SM_SHARE``); the saving is taken off F and B in
    proportion to their transfers (``f_comm``, ``b_comm``: the EP part of F and B)."""
    f2, b2 = list(f), list(b)
    for s, (fs, bs, fc, bc) in enumerate(zip(f, b, f_comm, b_comm)):
        comm = fc + bc
        if comm <= 0.0:
            continue
        compute = fs + bs - comm
        pair = max(compute + COMM_SM_SHARE * comm, comm)
        save = paired * (fs + bs - pair)
        f2[s] = fs - save * fc / comm
        b2[s] = bs - save * bc / comm
    return f2, b2
