"""Operator-level sharding of one block on the tp axis: build the ILP, solve, read it back.

The block's joint forward+backward ATen graph (``ir.OpGraph``) carries, per node, the
legal strategies DTensor knows (placements of inputs and outputs on a 1-D tp mesh).
This module

1. prepares the graph: dedupes identical views (``F.linear`` views its input once per
   projection), filters strategies that break a rule (a sharded dim not divisible by
   tp; sequence sharding when ``sp`` is off — dims of role seq/tokens stay whole on tp
   unless sequence parallelism is on (a batch dim has size 1 at the traced micro-batch, so
   only a batch·heads dim can be sharded, which shards heads); with ``sp`` on, Megatron's rule that nothing
   outside a GEMM runs on a replicated sequence: a non-GEMM op may not output a
   replicated activation that has a sequence dim, so norms, dropout and residual adds
   run sequence-sharded and only GEMM inputs are all-gathered), and merges *followers* (views and unary
   elementwise ops whose layout is a function of their producer's) into one ILP node;
2. prices every strategy (compute seconds on the local shard, saved-activation bytes)
   and every redistribution (collective seconds on the tp group), see ``placements``;
3. prices the model states of every parameter at ``memory_price`` (what recomputation
   would cost to free the same memory), so a weight is replicated only when that pays;
4. ties each parameter to the sink of its gradient (the gradient must end in the
   parameter's layout: a partial gradient is all-reduced, Megatron's norm-weight
   all-reduce under SP) and a block's output to the next block's input (blocks repeat);
5. solves the ILP of ``ilp.py`` and returns a ``BlockSharding``: per-node strategies
   and the collectives they imply, ready to be priced per pipeline stage.

Axes other than tp have fixed roles and enter only as scale factors: the block is
traced at micro-batch 1 and full sequence; a GPU holds ``mbs`` sequences and
``1/cp`` of each sequence (first seq dim of a tensor divided by cp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from autoplan.ir import OpGraph, OpNode, Strategy, TensorInfo, TensorRef
from autoplan.search import ilp
from autoplan.search.placements import is_shard, redistribution, redistribution_bytes, shard_dim

SEQ_ROLES = ("seq", "tokens")
_FLOAT = ("bf16", "fp16", "fp32", "fp64", "fp8")


@dataclass(frozen=True)
class Collective:
    """One collective a block runs per micro-batch on its tp group."""

    kind: str            # all_reduce | reduce_scatter | all_gather | all_to_all
    nbytes: float        # nccl-tests size argument, bytes
    phase: str           # forward | backward (input grad) | wgrad
    tensor: str          # what is redistributed, e.g. "o_proj.mm -> add (P->R)"
    seconds: float       # time on the tp group


@dataclass(frozen=True)
class BlockSharding:
    """The solved sharding of one block kind for one (tp, sp, mbs, cp, recompute)."""

    strategies: dict[str, str]                 # node name -> strategy name
    placements: dict[str, str]                 # node name -> placement of output 0
    param_placements: dict[str, str]           # parameter name -> placement
    collectives: tuple[Collective, ...]
    forward_s: float                           # compute seconds, one micro-batch
    backward_s: float                          # input-gradient compute (incl. recompute)
    wgrad_s: float                             # weight-gradient compute
    recompute_s: float                         # part of backward_s spent recomputing
    saved_bytes: float                         # activations kept for backward, one micro-batch
    param_numel: int                           # parameters held per GPU (after tp sharding)
    objective_s: float
    gap: float
    solve_seconds: float
    ilp_size: dict[str, int] = field(default_factory=dict)

    def comm_seconds(self, phase: str | None = None) -> float:
        return sum(c.seconds for c in self.collectives if phase is None or c.phase == phase)

    def count(self, kind: str, phase: str | None = None) -> int:
        return sum(1 for c in self.collectives if c.kind == kind and (phase is None or c.phase == phase))


@dataclass(frozen=True)
class ShardingContext:
    """Everything the block ILP needs besides the graph.

    ``op_seconds(kind, flops, nbytes, gemm)`` prices one local op on one GPU;
    ``tp_seconds(kind, nbytes)`` prices a collective on the block's tp group.
    """

    tp: int
    sp: bool
    mbs: int = 1
    cp: int = 1
    recompute: str = "none"                       # none | selective | full
    op_seconds: Callable[[str, float, float, tuple | None], float] = None  # type: ignore[assignment]
    tp_seconds: Callable[[str, float], float] = None                      # type: ignore[assignment]
    forbid_tp_collectives: bool = False           # tp group leaves the NVLink domain
    memory_weight_s_per_byte: float = 1e-15       # tie-break toward lower activation memory
    merge_followers: bool = True
    backend: str = "cpsat"
    time_limit_s: float = 30.0


# --- graph preparation ---------------------------------------------------------

def _scaled_numel(t: TensorInfo, mbs: int, cp: int) -> float:
    """Elements of ``t`` on one GPU before tp sharding (micro-batch mbs, 1/cp of the sequence)."""
    n = float(t.numel)
    seen_seq = False
    for role in t.dim_roles:
        if role in ("batch",):
            n *= mbs
        elif role == "tokens":
            n *= mbs / (1 if seen_seq else cp)
            seen_seq = True
        elif role == "seq" and not seen_seq:
            n /= cp
            seen_seq = True
    return n


def _local_dim(t: TensorInfo, d: int, mbs: int, cp: int) -> float:
    size = t.shape[d]
    role = t.dim_roles[d] if d < len(t.dim_roles) else ""
    if role == "batch":
        return size * mbs
    if role == "tokens":
        return size * mbs / cp
    if role == "seq":
        return size / cp
    return size


def _bytes_per_elem(t: TensorInfo) -> float:
    return t.nbytes / t.numel if t.numel else 0


def _placement_ok(t: TensorInfo | None, pl: str | None, ctx: ShardingContext, activation: bool) -> bool:
    if t is None or pl is None:
        return True
    if pl == "P":
        return t.dtype in _FLOAT
    d = shard_dim(pl)
    if d is None:
        return True
    if d < 0:
        d += len(t.shape)
    if d >= len(t.shape):
        return False
    role = t.dim_roles[d] if d < len(t.dim_roles) else ""
    if activation and role in SEQ_ROLES and not (ctx.sp and role in ("seq", "tokens")):
        return False
    local = _local_dim(t, d, ctx.mbs, ctx.cp)
    return local >= ctx.tp and float(local / ctx.tp).is_integer()


def _replicated_sequence(n: OpNode, s: Strategy, ctx: ShardingContext) -> bool:
    """Under SP, a non-GEMM compute op that leaves an activation with a sequence dim replicated."""
    if not ctx.sp or n.op == "placeholder" or n.gemm is not None or n.is_view or n.role == "param":
        return False
    return any(p == "R" and t is not None and t.dtype in _FLOAT and any(r in ("seq", "tokens") for r in t.dim_roles)
               for t, p in zip(n.outputs, s.outputs))


def _placeholder_strategies(n: OpNode) -> tuple[Strategy, ...]:
    t = n.out
    if t is None:
        return (Strategy((), ("R",)),)
    pls = ["R"] + [f"S({d})" for d in range(len(t.shape))]
    return tuple(Strategy((), (p,)) for p in pls)


def _boundary_strategies(n: OpNode, cands, ctx: ShardingContext):
    """The residual stream between blocks: sequence-sharded with SP (Megatron's layout), else replicated."""
    want = "R"
    if ctx.sp and n.out is not None:
        seq = [d for d, r in enumerate(n.out.dim_roles) if r in ("seq", "tokens")]
        if seq and _placement_ok(n.out, f"S({seq[0]})", ctx, activation=True):
            want = f"S({seq[0]})"
    return tuple(s for s in cands if s.outputs[0] == want) or cands[:1]


@dataclass
class _Unit:
    """One ILP node: a leader op and the followers merged into it."""

    leader: str
    members: list[str]
    strategies: list[dict[str, Strategy]]   # per unit strategy: member -> its strategy


@dataclass(frozen=True)
class _Read:
    """One read of a tensor that may need a redistribution.

    ``reader`` is an op reading input ``index``, a parameter's gradient sink (``sink`` =
    the parameter placeholder: the gradient must end in the parameter's layout) or a
    block-boundary placeholder (``index`` = -1: this block's output is the next block's
    input).  ``views`` are the same-size views between the tensor and the reader, nearest
    the reader first: reads through views of one base share one redistribution of the base.
    """

    reader: str
    index: int
    own: TensorRef                # the tensor the reader reads (before looking through views)
    sink: str = ""
    views: tuple[str, ...] = ()


@dataclass
class _Prepared:
    graph: OpGraph
    units: list[_Unit]
    unit_of: dict[str, int]
    alias: dict[str, str]                                # deduped view -> kept view
    reads: dict[TensorRef, list[_Read]]                  # base tensor -> its reads


def _dedupe_views(graph: OpGraph) -> dict[str, str]:
    """Identical views (same op, same input, same output shape) collapse to the first one."""
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for n in graph.nodes:
        if not n.is_view or n.op == "placeholder":
            continue
        ins = tuple((alias.get(r.node, r.node), r.index) for r in n.inputs)
        key = (n.op, ins, tuple(t.shape if t else None for t in n.outputs))
        if key in seen:
            alias[n.name] = seen[key]
        else:
            seen[key] = n.name
    return alias


def _resolve(ref: TensorRef, alias: dict[str, str]) -> TensorRef:
    return TensorRef(alias.get(ref.node, ref.node), ref.index)


def prepare(graph: OpGraph, ctx: ShardingContext) -> _Prepared:
    alias = _dedupe_views(graph)
    nodes = [n for n in graph.nodes if n.name not in alias and n.op != "output"]
    units: list[_Unit] = []
    unit_of: dict[str, int] = {}
    for n in nodes:
        ok = _legal_strategies(graph, n, alias, ctx)
        if ctx.merge_followers and _is_follower(n, alias, unit_of, units, ok):
            producer = _resolve(n.inputs[0], alias)
            u = units[unit_of[producer.node]]
            for us in u.strategies:
                pl = us[producer.node].outputs[producer.index]
                us[n.name] = next(s for s in ok if s.inputs[0] == pl)
            u.members.append(n.name)
            unit_of[n.name] = unit_of[producer.node]
        else:
            unit_of[n.name] = len(units)
            units.append(_Unit(n.name, [n.name], [{n.name: s} for s in ok]))
    return _Prepared(graph, units, unit_of, alias, _reads(graph, nodes, alias, unit_of))


def _vocab_parallel_rules(n: OpNode) -> tuple[Strategy, ...]:
    """Vocab-parallel cross entropy (Megatron; torch's ``loss_parallel``), which DTensor's
    registry does not offer: log-softmax and NLL on logits sharded over the vocabulary dim,
    reduced by all-reducing per-token statistics (see ``_intrinsic``).  NLL takes (N, C)
    log-probs, so its vocab dim is 1; log-softmax works on the last dim."""
    if n.out is None:
        return ()
    last = f"S({len(n.out.shape) - 1})"
    rules = {
        "aten._log_softmax.default": (1, Strategy((last,), (last,))),
        "aten._log_softmax_backward_data.default": (2, Strategy((last, last), (last,))),
        "aten.nll_loss_forward.default": (2, Strategy(("S(1)", "R"), ("P", "R"))),
        "aten.nll_loss_backward.default": (4, Strategy(("R", "S(1)", "R", "R"), ("S(1)",))),
    }
    arity, rule = rules.get(n.op, (-1, None))
    return (rule,) if rule is not None and len(n.inputs) == arity else ()


def _identity_rules(n: OpNode) -> tuple[Strategy, ...]:
    """Same-shape unary ops run in any layout of their input.

    DTensor derives a follow-the-input op's strategies from the layouts its producer offered
    when the frontend enumerated them; a layout the ILP adds later (vocab-parallel logits)
    would otherwise find no strategy on ``detach`` or a dtype cast.  Views, detach and
    casts are linear, so a partial sum stays partial; other elementwise ops only shard."""
    if len(n.inputs) != 1 or n.out is None or len(n.outputs) != 1 or not n.strategies:
        return ()
    if not all(len(s.inputs) == 1 and s.outputs and s.inputs[0] == s.outputs[0] for s in n.strategies):
        return ()
    linear = n.is_view or n.op in ("aten._to_copy.default", "aten.clone.default", "aten.detach.default")
    known = {s.inputs[0] for s in n.strategies}
    pls = [f"S({d})" for d in range(len(n.out.shape))] + (["P"] if linear else [])
    return tuple(Strategy((p,), (p,)) for p in pls if p not in known)


def _intrinsic(n: OpNode, s: Strategy, ctx: ShardingContext) -> list[tuple[str, float]]:
    """Collectives a strategy runs inside the op: vocab-parallel softmax all-reduces the
    per-token max and sum (forward) and the per-token gradient sum (backward), fp32."""
    if ctx.tp == 1 or not s.inputs or not is_shard(s.inputs[0]):
        return []
    t = n.out
    if t is None or not t.shape:
        return []
    tokens = _scaled_numel(t, ctx.mbs, ctx.cp) / t.shape[-1]
    if n.op == "aten._log_softmax.default":
        return [("all_reduce", tokens * 4), ("all_reduce", tokens * 4)]
    if n.op == "aten._log_softmax_backward_data.default":
        return [("all_reduce", tokens * 4)]
    return []


def _legal_strategies(graph: OpGraph, n: OpNode, alias: dict[str, str], ctx: ShardingContext) -> list[Strategy]:
    """The node's strategies that respect divisibility, the sp rules and the block boundary."""
    if n.op == "placeholder":
        cands = _placeholder_strategies(n)
        if n.role in ("input", "tangent"):
            cands = _boundary_strategies(n, cands, ctx)
    else:
        cands = tuple(n.strategies or (_replicated(n),)) + _vocab_parallel_rules(n) + _identity_rules(n)
    ok = []
    for s in cands:
        if len(s.inputs) != len(n.inputs) and n.op != "placeholder":
            continue
        ins_ok = all(_placement_ok(graph.tensor(_resolve(r, alias)), p, ctx,
                                   graph.node(_resolve(r, alias).node).role != "param")
                     for r, p in zip(n.inputs, s.inputs))
        outs_ok = all(_placement_ok(t, p, ctx, n.role != "param") for t, p in zip(n.outputs, s.outputs))
        if ins_ok and outs_ok and not _replicated_sequence(n, s, ctx):
            ok.append(s)
    return ok or [_replicated(n)]   # every op can run replicated


def _replicated(n: OpNode) -> Strategy:
    return Strategy(tuple("R" for _ in n.inputs), tuple(None if t is None else "R" for t in n.outputs))


def _is_follower(n: OpNode, alias, unit_of, units, strategies) -> bool:
    """A view or unary elementwise op whose layout is a function of its producer's."""
    if n.op == "placeholder" or len(n.inputs) != 1:
        return False
    if not n.is_view and not _is_unary_elementwise(strategies):
        return False
    producer = _resolve(n.inputs[0], alias)
    if producer.node not in unit_of:
        return False
    for us in units[unit_of[producer.node]].strategies:
        outs = us[producer.node].outputs
        pl = outs[producer.index] if producer.index < len(outs) else None
        if pl is None or sum(1 for s in strategies if s.inputs[0] == pl) != 1:
            return False
    return True


def _is_unary_elementwise(strategies) -> bool:
    return all(len(s.inputs) == 1 and s.outputs and s.outputs[0] == s.inputs[0] for s in strategies)


def _reads(graph: OpGraph, nodes: list[OpNode], alias: dict[str, str], unit_of: dict[str, int]):
    """Every read that can need a redistribution, keyed by the base tensor it reads.

    A read of a same-size view that runs in its producer's layout (a merged follower) is
    moved to the view's input, so that reads through ``x``, ``x.t()`` and ``x.view(...)``
    share one all-gather of ``x`` — as Megatron reuses one gathered input.  A merged
    follower's read of its own producer needs no redistribution and is dropped.
    """
    def transparent(name: str) -> bool:
        v = graph.node(name)
        src = graph.tensor(_resolve(v.inputs[0], alias)) if v.inputs else None
        return (v.is_view and len(v.inputs) == 1 and v.out is not None and src is not None
                and v.out.numel == src.numel and unit_of.get(name) == unit_of.get(_resolve(v.inputs[0], alias).node))

    def base(ref: TensorRef, views: tuple[str, ...]) -> tuple[TensorRef, tuple[str, ...]]:
        while ref.index == 0 and ref.node in unit_of and transparent(ref.node):
            views = views + (ref.node,)
            ref = _resolve(graph.node(ref.node).inputs[0], alias)
        return ref, views

    reads: dict[TensorRef, list[_Read]] = {}
    for n in nodes:
        for i, r in enumerate(n.inputs):
            r = _resolve(r, alias)
            if n.name in unit_of and unit_of[n.name] == unit_of.get(r.node) and i == 0 and len(n.inputs) == 1:
                continue                      # a merged follower reads its producer in place
            ref, views = base(r, ())
            reads.setdefault(ref, []).append(_Read(n.name, i, r, views=views))
    for grad, param in _grad_sinks(graph, alias):
        ref, views = base(grad, ())
        reads.setdefault(ref, []).append(_Read(param, 0, grad, sink=param, views=views))
    for out, placeholder in _boundary(graph, alias):
        ref, views = base(out, ())
        reads.setdefault(ref, []).append(_Read(placeholder, -1, out, views=views))
    return reads


def _resolved_reads(g: OpGraph, reads: dict[TensorRef, list[_Read]], strategies_of, inverse):
    """tensor -> [(read, [needed layout per strategy of the reader's unit])].

    A read whose layouts cannot all be mapped back through its views stays on the
    tensor it reads directly."""
    out: dict[TensorRef, list[tuple[_Read, list[str | None]]]] = {}
    for ref in sorted(reads, key=lambda r: (r.node, r.index)):
        for read in reads[ref]:
            pls = [_required(g, read, f, inverse) for f in strategies_of(read)]
            target = ref
            if read.views and any(p is None for p in pls):
                read = _Read(read.reader, read.index, read.own, read.sink, ())
                pls = [_required(g, read, f, inverse) for f in strategies_of(read)]
                target = read.own
            out.setdefault(target, []).append((read, pls))
    return out


def _grad_sinks(graph: OpGraph, alias: dict[str, str]) -> list[tuple[TensorRef, str]]:
    """(gradient tensor, parameter placeholder) for every parameter gradient the block returns."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    roles = graph.output_roles or ()
    return [(_resolve(r, alias), role[11:]) for r, role in zip(out_node.inputs, roles)
            if role.startswith("param_grad:")]


def _boundary(graph: OpGraph, alias: dict[str, str]) -> list[tuple[TensorRef, str]]:
    """Blocks repeat: this block's output feeds the next block's input placeholder, and the
    gradient of this block's input is the tangent of the block below."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    roles = graph.output_roles or tuple("activation" for _ in out_node.inputs)
    inputs = [n.name for n in graph.nodes if n.op == "placeholder" and n.role == "input"]
    tangents = [n.name for n in graph.nodes if n.op == "placeholder" and n.role == "tangent"]
    acts = [_resolve(r, alias) for r, role in zip(out_node.inputs, roles) if role == "activation"]
    pairs = []
    if inputs and len(inputs) == len(acts):
        pairs += list(zip(acts, inputs))
        for r, role in zip(out_node.inputs, roles):
            target = role[11:] if role.startswith("input_grad:") else None
            if target in inputs and len(tangents) == len(inputs):
                pairs.append((_resolve(r, alias), tangents[inputs.index(target)]))
    return pairs


def _required(g: OpGraph, read: _Read, strategy_of: Callable[[str], Strategy], inverse) -> str | None:
    """The layout ``read`` needs of its base tensor, given the readers' chosen strategies."""
    if read.sink:
        pl = strategy_of(read.sink).outputs[0]
    elif read.index < 0:
        pl = strategy_of(read.reader).outputs[0]
    else:
        pl = strategy_of(read.reader).inputs[read.index]
    for v in read.views:                     # map back through the views to the base
        if pl is None:
            return None
        pl = inverse(v).get(pl)
    return pl


def _view_inverse(g: OpGraph):
    """view node -> {output placement: input placement}, from its DTensor strategies."""
    cache: dict[str, dict[str, str]] = {}

    def inverse(name: str) -> dict[str, str]:
        if name not in cache:
            pairs: dict[str, set[str]] = {}
            for s in g.node(name).strategies:
                if s.outputs and s.outputs[0] and s.inputs:
                    pairs.setdefault(s.outputs[0], set()).add(s.inputs[0])
            pairs.setdefault("R", {"R"})       # a view of a replicated or partial tensor is one too
            pairs.setdefault("P", {"P"})
            cache[name] = {o: next(iter(i)) for o, i in pairs.items() if len(i) == 1}
        return cache[name]
    return inverse


def _read_group(g: OpGraph, read: _Read) -> int:
    """Reads in one phase share a redistribution; backward redistributes a saved tensor again."""
    if read.sink:
        return BACKWARD_GROUP
    n = g.node(read.reader)
    return FORWARD_GROUP if n.phase == "forward" and n.role != "tangent" else BACKWARD_GROUP


def _read_phase(g: OpGraph, read: _Read) -> str:
    if read.sink:
        return "wgrad"
    n = g.node(read.reader)
    if n.phase == "forward" and n.role != "tangent":
        return "forward"
    return "wgrad" if n.wgrad else "backward"


FORWARD_GROUP, BACKWARD_GROUP = 0, 1


# --- pricing -----------------------------------------------------------------------

def _op_kind(n: OpNode) -> str:
    if n.gemm is not None:
        return "gemm"
    if "attention" in n.op:
        return "attention_bwd" if "backward" in n.op else "attention_fwd"
    return "memory"


def _node_seconds(n: OpNode, s: Strategy, ctx: ShardingContext) -> float:
    if n.op == "placeholder" or n.is_view:
        return 0.0
    sharded = any(is_shard(p) for p in s.inputs) or any(is_shard(p) for p in s.outputs if p)
    div = ctx.tp if sharded else 1
    scale = ctx.mbs / ctx.cp
    flops = n.flops * scale / div
    nbytes = (n.bytes_read + n.bytes_written) * scale / div
    gemm = None
    if n.gemm is not None:
        m, nn, k = n.gemm
        m = m * scale
        out = s.outputs[0] if s.outputs else None
        if out == "P":
            k = k / ctx.tp
        elif is_shard(out):
            t = n.out
            d = shard_dim(out) % len(t.shape)
            if d == len(t.shape) - 1:
                nn = nn / ctx.tp
            else:
                m = m / ctx.tp
        gemm = (max(m, 1.0), max(nn, 1.0), max(k, 1.0))
    return ctx.op_seconds(_op_kind(n), flops, nbytes, gemm)


def _local_bytes(t: TensorInfo, pl: str | None, ctx: ShardingContext) -> float:
    b = _scaled_numel(t, ctx.mbs, ctx.cp) * _bytes_per_elem(t)
    return b / ctx.tp if is_shard(pl) else b


def _recomputed(n: OpNode, recompute: str) -> bool:
    """Forward nodes recomputed in backward: all for full, the attention core for selective.

    The attention core is the attention kernel and every op whose output has two
    sequence dims (scores, softmax, dropout masks: Korthikanti's 5·a·s²·b term).
    """
    if n.phase != "forward" or n.op == "placeholder" or recompute == "none":
        return False
    if recompute == "full":
        return True
    if "attention" in n.op:
        return True
    return any(t is not None and sum(r == "seq" for r in t.dim_roles) >= 2 for t in n.outputs)


def _saved_bytes(g: OpGraph, n: OpNode, s: Strategy, ctx: ShardingContext) -> float:
    """Activation bytes this node keeps for backward under strategy ``s``.

    Only the outputs backward reads count (a dropout keeps its mask, not its output).
    """
    if not n.saved or n.role == "param" or n.is_view:
        return 0.0
    saved = g.saved_outputs()
    outs = [(i, t, p) for i, (t, p) in enumerate(zip(n.outputs, s.outputs))
            if t is not None and TensorRef(n.name, i) in saved]
    if ctx.recompute == "full":
        return sum(_local_bytes(t, p, ctx) for _, t, p in outs) if n.role == "input" else 0.0
    if _recomputed(n, ctx.recompute):
        # the attention kernel's output feeds the next GEMM and stays saved; its aux outputs do not
        return sum(_local_bytes(t, p, ctx) for i, t, p in outs if i == 0 and "attention" in n.op)
    return sum(_local_bytes(t, p, ctx) for _, t, p in outs)


def _redistribution_seconds(g: OpGraph, ref: TensorRef, a: str, b: str, group: int, ctx: ShardingContext):
    """(kind, nbytes, seconds) of turning tensor ``ref`` from layout a into b for one read group.

    A forward collective is repeated when full recomputation reruns the forward."""
    kind = redistribution(a, b)
    if kind is None:
        return None
    t = g.tensor(ref)
    nbytes = redistribution_bytes(kind, _scaled_numel(t, ctx.mbs, ctx.cp) * _bytes_per_elem(t), ctx.tp)
    seconds = ctx.tp_seconds(kind, nbytes)
    producer = g.node(ref.node)
    if group == FORWARD_GROUP and ctx.recompute == "full" and producer.phase == "forward" \
            and producer.op != "placeholder":
        seconds *= 2.0
    return kind, nbytes, seconds


# --- building and solving -------------------------------------------------------

STATE_BYTES_PER_PARAM = 18.0    # bf16 weight + fp32 grad + fp32 master, m, v (costmodels.memory)


def memory_price(g: OpGraph, ctx: ShardingContext) -> float:
    """Seconds one byte of GPU memory is worth: what recomputation would cost to free it.

    The block's replicated forward time divided by its replicated saved-activation bytes:
    memory can always be bought back by recomputing the forward that filled it.  Used to
    price the model states of a parameter the tp axis leaves replicated (18 bytes per
    parameter), so that replicating a weight to save a collective must win back its memory.
    """
    fwd = sum(_node_seconds(n, _replicated(n), ctx) for n in g.ops("forward"))
    saved = sum(_local_bytes(t, "R", ctx) for r in g.saved_outputs()
                if (t := g.tensor(r)) is not None and g.node(r.node).role != "param")
    return fwd / saved if saved else 0.0


def build_problem(prep: _Prepared, ctx: ShardingContext) -> ilp.IlpProblem:
    g = prep.graph
    price = memory_price(g, ctx)
    ilp_nodes: list[ilp.IlpNode] = []
    for u in prep.units:
        costs, mems = [], []
        for us in u.strategies:
            sec, mem, state = 0.0, 0.0, 0.0
            for name, s in us.items():
                n = g.node(name)
                sec += _node_seconds(n, s, ctx) * (2.0 if _recomputed(n, ctx.recompute) else 1.0)
                sec += sum(ctx.tp_seconds(kind, nbytes) for kind, nbytes in _intrinsic(n, s, ctx))
                mem += _saved_bytes(g, n, s, ctx)
                if n.role == "param" and n.op == "placeholder" and n.out is not None:
                    state += n.out.numel / (ctx.tp if is_shard(s.outputs[0]) else 1) * STATE_BYTES_PER_PARAM
            costs.append(sec + ctx.memory_weight_s_per_byte * mem + price * state)
            mems.append(mem + state)
        ilp_nodes.append(ilp.IlpNode(u.leader, tuple(costs), tuple(mems)))

    inverse = _view_inverse(g)

    def unit_strategies(read: _Read):
        return [(lambda name, us=us: us[name]) for us in prep.units[prep.unit_of[read.sink or read.reader]].strategies]

    tensors = []
    for ref, rows_in in _resolved_reads(g, prep.reads, unit_strategies, inverse).items():
        if g.tensor(ref) is None or ref.node not in prep.unit_of:
            continue
        pu = prep.unit_of[ref.node]
        ids: dict[str, int] = {}

        def pid(p: str) -> int:
            return ids.setdefault(p, len(ids))

        out_pl = tuple(pid(us[ref.node].outputs[ref.index] or "R") for us in prep.units[pu].strategies)
        rows = [(prep.unit_of[read.sink or read.reader], tuple(pid(p or "R") for p in pls), _read_group(g, read))
                for read, pls in rows_in]
        names = {v: k for k, v in ids.items()}
        redist, forbidden = [], []
        for grp in sorted({r[2] for r in rows}):
            for a in names:
                for b in names:
                    priced = a != b and _redistribution_seconds(g, ref, names[a], names[b], grp, ctx)
                    if priced:
                        redist.append((a, b, grp, priced[2]))
                        if ctx.forbid_tp_collectives:
                            forbidden.append((a, b))
        tensors.append(ilp.IlpTensor(f"{ref.node}:{ref.index}", pu, out_pl, tuple(rows), tuple(redist),
                                     tuple(sorted(set(forbidden)))))
    return ilp.IlpProblem(tuple(ilp_nodes), tuple(tensors))


@dataclass(frozen=True)
class BlockAssignment:
    """A solved ILP: the strategy of every node of one block graph on its tp axis."""

    choice: dict[str, Strategy]
    objective_s: float
    gap: float
    solve_seconds: float
    status: str
    ilp_size: dict[str, int]


def solve_assignment(graph: OpGraph, ctx: ShardingContext) -> BlockAssignment:
    """Solve the block ILP for ``ctx`` and return the chosen strategy of every node.

    With tp = 1 there is nothing to choose: every op runs replicated."""
    if ctx.tp == 1:
        choice = {n.name: _replicated(n) for n in graph.nodes if n.op != "output"}
        return BlockAssignment(choice, 0.0, 0.0, 0.0, "optimal", {"nodes": 0, "x_vars": 0, "e_vars": 0,
                                                                   "w_vars": 0, "constraints": 0})
    prep = prepare(graph, ctx)
    problem = build_problem(prep, ctx)
    sol = ilp.solve(problem, ctx.backend, ctx.time_limit_s)
    choice: dict[str, Strategy] = {}
    for ui, u in enumerate(prep.units):
        choice.update(u.strategies[sol.choice[ui]])
    for dup, kept in prep.alias.items():
        choice[dup] = choice[kept]
    return BlockAssignment(choice, sol.objective, sol.gap, sol.solve_seconds, sol.status, problem.size)


def solve_block(graph: OpGraph, ctx: ShardingContext) -> BlockSharding:
    """Choose a strategy for every op of ``graph`` on the tp axis and price the result."""
    return price_assignment(graph, solve_assignment(graph, ctx), ctx)


def price_assignment(graph: OpGraph, assignment: BlockAssignment, ctx: ShardingContext) -> BlockSharding:
    """Price a solved assignment under ``ctx``.

    Micro-batch, cp and recompute may differ from the ones it was solved at: every cost
    scales with them and the layout stays the best one (tested)."""
    g = graph
    chosen = assignment.choice
    alias = _dedupe_views(g)
    fwd = bwd = wgd = rec = saved = 0.0
    intrinsic: list[Collective] = []
    for name, s in chosen.items():
        if name in alias:
            continue
        n = g.node(name)
        t = _node_seconds(n, s, ctx)
        if n.phase == "forward":
            fwd += t
        elif n.wgrad:
            wgd += t
        else:
            bwd += t
        if _recomputed(n, ctx.recompute):
            bwd += t
            rec += t
        saved += _saved_bytes(g, n, s, ctx)
        for kind, nbytes in _intrinsic(n, s, ctx):
            phase = "forward" if n.phase == "forward" else "backward"
            intrinsic.append(Collective(kind, nbytes, phase, f"{n.module or n.op}:{n.name} (vocab-parallel)",
                                        ctx.tp_seconds(kind, nbytes)))

    nodes = [n for n in g.nodes if n.name not in alias and n.op != "output"]
    unit_of = _units_of_choice(g, nodes, alias, chosen)
    reads = _resolved_reads(g, _reads(g, nodes, alias, unit_of), lambda read: [chosen.__getitem__],
                            _view_inverse(g))
    collectives = intrinsic
    for ref, rows in reads.items():
        if g.tensor(ref) is None:
            continue
        outs = chosen[ref.node].outputs
        a = (outs[ref.index] if ref.index < len(outs) else None) or "R"
        seen = set()
        for read, (b,) in rows:
            grp = _read_group(g, read)
            b = b or "R"
            if b == a or (b, grp) in seen:
                continue
            priced = _redistribution_seconds(g, ref, a, b, grp, ctx)
            if not priced:
                continue
            seen.add((b, grp))
            kind, nbytes, seconds = priced
            producer = g.node(ref.node)
            label = f"{producer.module or producer.op}:{ref.node} ({a}->{b})"
            phase = _read_phase(g, read)
            if grp == FORWARD_GROUP and ctx.recompute == "full" and producer.phase == "forward" \
                    and producer.op != "placeholder":
                seconds /= 2.0
                collectives.append(Collective(kind, nbytes, "backward", label + " [recompute]", seconds))
            collectives.append(Collective(kind, nbytes, phase, label, seconds))

    params = {}
    param_numel = 0
    for n in g.params():
        pl = chosen[n.name].outputs[0]
        params[n.param or n.name] = pl
        param_numel += n.out.numel // (ctx.tp if is_shard(pl) else 1)
    return BlockSharding(
        strategies={k: v.name for k, v in sorted(chosen.items())},
        placements={k: (v.outputs[0] or "-") if v.outputs else "-" for k, v in sorted(chosen.items())},
        param_placements=dict(sorted(params.items())),
        collectives=tuple(collectives),
        forward_s=fwd, backward_s=bwd, wgrad_s=wgd, recompute_s=rec, saved_bytes=saved,
        param_numel=param_numel, objective_s=assignment.objective_s, gap=assignment.gap,
        solve_seconds=assignment.solve_seconds, ilp_size=assignment.ilp_size,
    )


def _units_of_choice(g: OpGraph, nodes: list[OpNode], alias, chosen: dict[str, Strategy]) -> dict[str, int]:
    """Which ops run in their producer's layout (merged followers) under a chosen assignment."""
    unit_of: dict[str, int] = {}
    for i, n in enumerate(nodes):
        unit_of[n.name] = i
        if n.op != "placeholder" and len(n.inputs) == 1 and (n.is_view or _is_unary_elementwise(n.strategies)):
            src = _resolve(n.inputs[0], alias)
            outs = chosen[src.node].outputs if src.node in chosen else ()
            if src.index < len(outs) and outs[src.index] == chosen[n.name].inputs[0]:
                unit_of[n.name] = unit_of[src.node]
    return unit_of
