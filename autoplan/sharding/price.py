"""One pricing pass for the block ILP: what a strategy costs and what a redistribution costs.

The same functions build the ILP's objective (``solve.build_problem``) and price the solved
layout back (``solve.price_assignment``), so the two cannot disagree.

* ``node_cost``: compute seconds of an op on its local shard (FLOPs and bytes ÷ tp when any
  operand is sharded; a GEMM's M, N or K shrinks with the sharded dim; a causal attention
  kernel's FLOPs × ``opkinds.attention_work_fraction``, the tiles it really computes; under an
  FP8 precision a linear GEMM at the FP8 peak plus the cast of its activation input,
  ``costmodels.precision``), how often it runs (2
  when recomputation reruns it in backward), the activation bytes it keeps for backward, the
  model states of a parameter, and the collectives a strategy runs inside the op
  (vocabulary-parallel softmax).
* ``redistribution_cost``: the collective that turns a tensor from layout a into b (see
  ``placements``) on the tp group, and how often it runs (a forward collective reruns under full
  recomputation).
* ``memory_price``: seconds one byte of GPU memory is worth (what recomputation would cost to
  free it), so that replicating a weight to save a collective must win back its memory.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from autoplan.ir import OpGraph, OpNode, Strategy, TensorInfo, TensorRef
from autoplan.opkinds import attention_work_fraction, is_attention_core, is_attention_kernel, op_kind
from autoplan.routing import routed_region
from autoplan.sharding.local import bytes_per_elem, local_bytes, scaled_numel
from autoplan.sharding.placements import is_shard, redistribution, redistribution_bytes, shard_dim
from autoplan.sharding.strategies import replicated
from autoplan.sharding.types import Gemm, ShardingContext
from costmodels.memory import GRAD_BYTES, OPTIMIZER_BYTES, PARAM_BYTES
from costmodels.precision import gemm_cast_bytes, is_low_precision

STATE_BYTES_PER_PARAM = PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES   # 18: bf16 weight, fp32 grad, master, m, v
SOFTMAX_STAT_BYTES = 4                                               # per-token max/sum statistics, fp32

TOKEN_ROLES = ("batch", "seq", "tokens")                             # dims that count tokens

# Reads of a tensor in one phase share one redistribution; backward redistributes a saved tensor again.
FORWARD_GROUP, BACKWARD_GROUP = 0, 1


@dataclass(frozen=True)
class OpCollective:
    """A collective a strategy runs inside an op, per micro-batch."""

    kind: str
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class NodeCost:
    seconds: float                       # compute seconds of one run on one GPU
    runs: int                            # 2 when recomputation reruns it in backward
    saved_bytes: float                   # activations kept for backward
    state_bytes: float                   # model states, for a parameter placeholder
    intrinsic: tuple[OpCollective, ...]  # collectives inside the op


@dataclass(frozen=True)
class Redistribution:
    kind: str                            # all_gather | reduce_scatter | all_reduce | all_to_all
    nbytes: float                        # nccl-tests size argument
    seconds: float                       # one run on the tp group
    runs: int                            # 2 when full recomputation reruns a forward collective


MATMUL_OPS = frozenset({"aten.mm.default", "aten.addmm.default"})


def op_saved(g: OpGraph) -> frozenset[str]:
    """Forward ops whose outputs the ``op`` policy keeps (torchtitan's selective op
    checkpointing, ``_apply_op_sac``): the attention kernels and the 1st, 3rd, 5th … matmul of
    the block in forward order — every second matmul is recomputed, with every element-wise op."""
    cached = g.__dict__.get("_op_saved")
    if cached is None:
        fwd = list(g.ops("forward"))
        mms = [n.name for n in fwd if n.op in MATMUL_OPS]
        cached = frozenset(mms[0::2]) | frozenset(n.name for n in fwd if is_attention_kernel(n))
        object.__setattr__(g, "_op_saved", cached)
    return cached


def recomputed(g: OpGraph, n: OpNode, recompute: str) -> bool:
    """Forward ops rerun in backward — the one predicate both time (``node_cost``'s runs, the
    recompute FLOPs of ``cost.parts``) and memory (``saved_bytes``) read: all of them for
    ``full``; the attention core for ``selective`` (Megatron); all but ``op_saved`` for ``op``."""
    if n.phase != "forward" or n.op == "placeholder" or recompute == "none":
        return False
    if recompute == "op":
        return n.name not in op_saved(g)
    return recompute == "full" or is_attention_core(n)


def node_seconds(n: OpNode, s: Strategy, ctx: ShardingContext) -> float:
    """Compute seconds of ``n`` under strategy ``s`` on one GPU (one run)."""
    if n.op == "placeholder" or n.is_view:
        return 0.0
    sharded = any(is_shard(p) for p in s.inputs) or any(is_shard(p) for p in s.outputs if p)
    div = ctx.tp if sharded else 1
    scale = ctx.mbs / ctx.cp
    flops = n.flops * scale / div * attention_work_fraction(n)
    nbytes = (n.bytes_read + n.bytes_written) * scale / div
    gemm: Gemm | None = None
    if n.gemm is not None:
        m: float
        nn: float
        k: float
        m, nn, k = n.gemm
        m = m * scale
        out = s.outputs[0] if s.outputs else None
        if out == "P":
            k = k / ctx.tp
        elif is_shard(out):
            t = n.out
            dim = shard_dim(out)
            assert t is not None and dim is not None    # a GEMM has an output; ``out`` is a shard
            d = dim % len(t.shape)
            if d == len(t.shape) - 1:
                nn = nn / ctx.tp
            else:
                m = m / ctx.tp
        gemm = (max(m, 1.0), max(nn, 1.0), max(k, 1.0))
        if is_low_precision(ctx.precision) and is_linear_gemm(n):
            tokens_out = n.out is not None and any(r in TOKEN_ROLES for r in n.out.dim_roles)
            cast = gemm_cast_bytes(ctx.precision, gemm[0], gemm[2], tokens_out)
            return ctx.op_seconds("gemm_fp8", flops, nbytes, gemm) + (
                ctx.op_seconds("cast", 0.0, cast, None) if cast else 0.0)
    return ctx.op_seconds(op_kind(n), flops, nbytes, gemm)


def is_linear_gemm(n: OpNode) -> bool:
    """A GEMM an FP8 precision runs at the FP8 peak (``node_seconds``): every GEMM but the
    attention core's."""
    return n.gemm is not None and not is_attention_core(n)


def outside_fp8_seconds(g: OpGraph, nodes: Iterable[tuple[OpNode, Strategy]], ctx: ShardingContext) -> dict[str, float]:
    """Seconds of one run, at ``ctx.recompute_precision``, of the linear GEMMs an FP8 engine runs
    outside its FP8 context: the forward GEMMs recomputation reruns, and the backward GEMMs of their
    layers (same module; every linear GEMM under ``full``).  Empty unless the context sets a
    recompute precision other than its own.

    The mechanism: Transformer Engine reads whether FP8 is on from ``fp8_autocast``'s global
    state when a layer runs forward, and its backward follows the forward that built the autograd
    graph.  A framework checkpoint (torch's ``checkpoint_wrapper``) reruns the layer from inside
    ``loss.backward()``, outside ``fp8_autocast``: the recompute runs in bf16, and the backward
    through the recomputed graph too; only the first forward, whose graph is dropped, runs in FP8.
    TE's own ``te.distributed.checkpoint`` (TE PR #24, 2022) and Megatron's re-enter the FP8
    context; Composer wrapped TE layers in torch's until its PR #3156 (Apr 2024: "FSDP activation
    checkpointing currently does not work with FP8 TE"), and Megatron-LM PR #7538 describes the
    same for its plain ``tensor_parallel.checkpoint``: "the recompute silently runs in BF16 while
    the forward ran in FP8"."""
    if not ctx.recompute_precision or ctx.recompute_precision == ctx.precision or ctx.recompute == "none":
        return {}
    nodes = tuple(nodes)
    rerun = {n.module for n, _ in nodes
             if n.phase == "forward" and is_linear_gemm(n) and recomputed(g, n, ctx.recompute)}
    if not rerun:
        return {}
    other = replace(ctx, precision=ctx.recompute_precision)
    routed = routed_region(g)                   # priced by cost.ep as the engine runs it
    return {n.name: node_seconds(n, s, other) for n, s in nodes
            if is_linear_gemm(n) and n.name not in routed and (ctx.recompute == "full" or n.module in rerun)}


def saved_bytes(g: OpGraph, n: OpNode, s: Strategy, ctx: ShardingContext) -> float:
    """Activation bytes ``n`` keeps for backward under ``s``: only the outputs backward reads
    (a dropout keeps its mask, not its output); none of a recomputed op but the attention
    kernel's output, which feeds the next GEMM; under full recomputation only the block input;
    under ``op`` every output of a kept op (checkpointing caches them whether backward reads
    them or not) and the block input."""
    if n.role == "param" or n.is_view:
        return 0.0

    def size(t: TensorInfo, p: str | None) -> float:
        return local_bytes(t, p, ctx.tp, ctx.mbs, ctx.cp)

    if ctx.recompute == "op" and n.phase == "forward" and n.op != "placeholder" and not recomputed(g, n, "op"):
        return sum(size(t, p) for t, p in zip(n.outputs, s.outputs) if t is not None)
    if not n.saved:
        return 0.0
    saved = g.saved_outputs()
    outs = [(i, t, p) for i, (t, p) in enumerate(zip(n.outputs, s.outputs))
            if t is not None and TensorRef(n.name, i) in saved]
    if ctx.recompute == "full":
        return sum(size(t, p) for _, t, p in outs) if n.role == "input" else 0.0
    if recomputed(g, n, ctx.recompute):
        return sum(size(t, p) for i, t, p in outs if i == 0 and is_attention_kernel(n))
    return sum(size(t, p) for _, t, p in outs)


def intrinsic_collectives(n: OpNode, s: Strategy, ctx: ShardingContext) -> tuple[OpCollective, ...]:
    """Vocabulary-parallel softmax all-reduces the per-token max and sum (forward) and the
    per-token gradient sum (backward), fp32 (Megatron's vocab-parallel cross entropy)."""
    if ctx.tp == 1 or not s.inputs or not is_shard(s.inputs[0]):
        return ()
    t = n.out
    if t is None or not t.shape or not t.shape[-1]:
        return ()
    tokens = scaled_numel(t, ctx.mbs, ctx.cp) / t.shape[-1]
    count = {"aten._log_softmax.default": 2, "aten._log_softmax_backward_data.default": 1}.get(n.op, 0)
    nbytes = tokens * SOFTMAX_STAT_BYTES
    return tuple(OpCollective("all_reduce", nbytes, ctx.tp_seconds("all_reduce", nbytes)) for _ in range(count))


def node_prices(n: OpNode, s: Strategy, ctx: ShardingContext) -> tuple[float, tuple[OpCollective, ...]]:
    """What ``node_cost`` reads of ``ctx`` besides its recompute policy: (seconds of one run,
    the intrinsic collectives)."""
    return node_seconds(n, s, ctx), intrinsic_collectives(n, s, ctx)


def node_cost(g: OpGraph, n: OpNode, s: Strategy, ctx: ShardingContext,
              priced: tuple[float, tuple[OpCollective, ...]] | None = None) -> NodeCost:
    """``priced``: ``node_prices(n, s, ctx)`` where the caller has it (at another recompute policy).
    A routed-expert node (``autoplan.routing``) costs no seconds and holds no model state here:
    ``cost.ep`` prices the region as the engine runs it; its saved activations stay (at the
    engine's layout, ``strategies.routed_strategy``)."""
    if n.name in routed_region(g):
        return NodeCost(0.0, 1, saved_bytes(g, n, s, ctx), 0.0, ())
    state = 0.0
    if n.role == "param" and n.op == "placeholder" and n.out is not None:
        state = n.out.numel / (ctx.tp if is_shard(s.outputs[0]) else 1) * STATE_BYTES_PER_PARAM
    seconds, intrinsic = priced if priced is not None else node_prices(n, s, ctx)
    return NodeCost(seconds, 2 if recomputed(g, n, ctx.recompute) else 1, saved_bytes(g, n, s, ctx), state, intrinsic)


def redistribution_cost(g: OpGraph, ref: TensorRef, a: str, b: str, group: int,
                        ctx: ShardingContext) -> Redistribution | None:
    """The collective turning tensor ``ref`` from layout ``a`` into ``b`` for one read group."""
    return redistribution_pricer(g, ref, ctx)(a, b, group)


def redistribution_pricer(g: OpGraph, ref: TensorRef, ctx: ShardingContext,
                          seconds: dict[tuple[str, float], float] | None = None
                          ) -> Callable[[str, str, int], Redistribution | None]:
    """``(a, b, group) -> redistribution_cost(g, ref, a, b, group, ctx)`` for one tensor, its
    size and producer read once and each kind's bytes and seconds priced once (the ILP asks for
    every pair of a tensor's layouts).  ``seconds``: ``ctx.tp_seconds`` by (kind, bytes), shared
    by the pricers of one context (its tensors repeat a few sizes)."""
    t = g.tensor(ref)
    assert t is not None                        # a redistributed tensor exists in the graph
    size = scaled_numel(t, ctx.mbs, ctx.cp) * bytes_per_elem(t)
    forward_runs = redistribution_runs(g, ref, FORWARD_GROUP, ctx.recompute)
    priced: dict[str, tuple[float, float]] = {}
    seconds = {} if seconds is None else seconds

    def cost(a: str, b: str, group: int) -> Redistribution | None:
        kind = redistribution(a, b)
        if kind is None:
            return None
        hit = priced.get(kind)
        if hit is None:
            nbytes = redistribution_bytes(kind, size, ctx.tp)
            sec = seconds.get((kind, nbytes))
            if sec is None:
                sec = seconds[(kind, nbytes)] = ctx.tp_seconds(kind, nbytes)
            hit = priced[kind] = (nbytes, sec)
        return Redistribution(kind, hit[0], hit[1], forward_runs if group == FORWARD_GROUP else 1)
    return cost


def redistribution_runs(g: OpGraph, ref: TensorRef, group: int, recompute: str) -> int:
    """How often a redistribution of ``ref`` for read ``group`` runs per micro-batch: twice for a
    forward one whose producer full or op recomputation reruns in backward, else once."""
    rerun = group == FORWARD_GROUP and recompute in ("full", "op") and recomputed(g, g.node(ref.node), recompute)
    return 2 if rerun else 1


def memory_price(g: OpGraph, ctx: ShardingContext) -> float:
    """Seconds one byte of GPU memory is worth: the block's replicated forward time divided by
    its replicated saved-activation bytes (memory can always be bought back by recomputing the
    forward that filled it)."""
    routed = routed_region(g)
    fwd = sum(node_seconds(n, replicated(n), ctx) for n in g.ops("forward") if n.name not in routed)
    saved = sum(local_bytes(t, "R", ctx.tp, ctx.mbs, ctx.cp) for r in g.saved_outputs()
                if (t := g.tensor(r)) is not None and g.node(r.node).role != "param" and r.node not in routed)
    return fwd / saved if saved else 0.0
