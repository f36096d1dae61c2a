"""Prepare a block graph for the ILP: ILP nodes (units) and the reads that may redistribute.

1. Identical views collapse to one (``F.linear`` views its input once per projection).
2. *Followers* — views and unary elementwise ops whose layout is a function of their
   producer's — merge into their producer's ILP node (a *unit*).
3. Every read of a tensor that may need a redistribution is recorded against the tensor's
   *base* (looking through same-size views run in their producer's layout), so that reads
   through ``x``, ``x.t()`` and ``x.view(...)`` share one all-gather of ``x``, as Megatron
   reuses one gathered input.  Besides op inputs there are two kinds of reads: a parameter's
   gradient *sink* (the gradient must end in the parameter's layout: a partial gradient is
   all-reduced, Megatron's norm-weight all-reduce under SP) and the block *boundary* (blocks
   repeat, so this block's output is read by the next block's input placeholder).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autoplan.ir import OpGraph, OpNode, Strategy, TensorRef
from autoplan.routing import routed_region
from autoplan.sharding.local import SEQ_ROLES, scaled_dim
from autoplan.sharding.price import BACKWARD_GROUP, FORWARD_GROUP
from autoplan.sharding.strategies import legal_strategies
from autoplan.sharding.types import ShardingContext
from costmodels.memo import Table, memo

PARAM_GRAD_ROLE = "param_grad:"    # OpGraph.output_roles labels, written by frontend/convert.py
INPUT_GRAD_ROLE = "input_grad:"
ViewInverse = Callable[[str], dict[str, str]]   # view node -> {output placement: input placement}


@dataclass
class Unit:
    """One ILP node: a leader op and the followers merged into it."""

    leader: str
    members: list[str]
    strategies: list[dict[str, Strategy]]   # per unit strategy: member -> its strategy


@dataclass(frozen=True)
class Read:
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


@dataclass(frozen=True)
class PrepareKey:
    """What a preparation reads: the graph (hashed whole, once), tp, sp, follower merging and
    which sharded dims divide (``_divides``: everything legality reads of mbs and cp)."""

    graph: OpGraph
    tp: int
    sp: bool
    merge_followers: bool
    divides: tuple[bool, ...]


@dataclass
class Prepared:
    graph: OpGraph
    units: list[Unit]
    unit_of: dict[str, int]
    alias: dict[str, str]                                # deduped view -> kept view
    reads: dict[TensorRef, list[Read]]                  # base tensor -> its reads
    key: PrepareKey | None = None                       # what it was prepared under (``prepare``)


def dedupe_views(graph: OpGraph) -> dict[str, str]:
    """Identical views (same op, same input, same output shape) collapse to the first one."""
    seen: dict[tuple[str, tuple[tuple[str, int], ...], tuple[tuple[int, ...] | None, ...]], str] = {}
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


def resolve(ref: TensorRef, alias: dict[str, str]) -> TensorRef:
    return TensorRef(alias.get(ref.node, ref.node), ref.index)


def prepare(graph: OpGraph, ctx: ShardingContext) -> Prepared:
    """The graph's units and reads under ``ctx`` (module docstring), remembered on what they
    depend on: the graph, tp, sp, follower merging and which sharded dims divide (``_divides``:
    the micro-batch and cp variants of one tp sub-mesh nearly always meet on one).  The result
    is read, never changed, by its users."""
    key = PrepareKey(graph, ctx.tp, ctx.sp, ctx.merge_followers, _divides(graph, ctx))
    return _PREPARED.get(key, lambda: _prepare(graph, ctx, key))


_PREPARED: Table[Prepared] = Table("sharding.prepared", 1024)


def _divides(graph: OpGraph, ctx: ShardingContext) -> tuple[bool, ...]:
    """Per distinct (size, role) of the graph's dims that scale with the micro-batch or cp
    (``local.local_dim``): whether tp divides its local size, as ``strategies.placement_ok``
    asks — everything legality reads of mbs and cp."""
    locals_ = (scaled_dim(size, role, ctx.mbs, ctx.cp) for size, role in _scaled_dims(graph))
    return tuple(local >= ctx.tp and float(local / ctx.tp).is_integer() for local in locals_)


@memo(1024)
def _scaled_dims(graph: OpGraph) -> tuple[tuple[int, str], ...]:
    """The distinct (size, role) of the graph's dims that scale with the micro-batch or cp."""
    return tuple(sorted({(size, role) for n in graph.nodes for t in n.outputs if t is not None
                         for size, role in zip(t.shape, t.dim_roles) if role in ("batch", *SEQ_ROLES)}))


def _prepare(graph: OpGraph, ctx: ShardingContext, key: PrepareKey | None = None) -> Prepared:
    alias = dedupe_views(graph)
    nodes = [n for n in graph.nodes if n.name not in alias and n.op != "output"]
    units: list[Unit] = []
    unit_of: dict[str, int] = {}
    routed = routed_region(graph)
    for n in nodes:
        ok = legal_strategies(graph, n, [resolve(r, alias) for r in n.inputs], ctx)
        # a routed-expert node is its own unit: reads never look through its views (its one
        # layout is the engine's, not one of the view's DTensor layouts)
        if ctx.merge_followers and n.name not in routed and _is_follower(n, alias, unit_of, units, ok):
            producer = resolve(n.inputs[0], alias)
            u = units[unit_of[producer.node]]
            for us in u.strategies:
                pl = us[producer.node].outputs[producer.index]
                us[n.name] = next(s for s in ok if s.inputs[0] == pl)
            u.members.append(n.name)
            unit_of[n.name] = unit_of[producer.node]
        else:
            unit_of[n.name] = len(units)
            units.append(Unit(n.name, [n.name], [{n.name: s} for s in ok]))
    return Prepared(graph, units, unit_of, alias, reads_of(graph, nodes, alias, unit_of), key)



def _is_follower(n: OpNode, alias: dict[str, str], unit_of: dict[str, int], units: list[Unit],
                 strategies: Sequence[Strategy]) -> bool:
    """A view or unary elementwise op whose layout is a function of its producer's."""
    if n.op == "placeholder" or len(n.inputs) != 1:
        return False
    if not n.is_view and not is_unary_elementwise(strategies):
        return False
    producer = resolve(n.inputs[0], alias)
    if producer.node not in unit_of:
        return False
    for us in units[unit_of[producer.node]].strategies:
        outs = us[producer.node].outputs
        pl = outs[producer.index] if producer.index < len(outs) else None
        if pl is None or sum(1 for s in strategies if s.inputs[0] == pl) != 1:
            return False
    return True


def is_unary_elementwise(strategies: Sequence[Strategy]) -> bool:
    return all(len(s.inputs) == 1 and s.outputs and s.outputs[0] == s.inputs[0] for s in strategies)


def reads_of(graph: OpGraph, nodes: list[OpNode], alias: dict[str, str],
             unit_of: dict[str, int]) -> dict[TensorRef, list[Read]]:
    """Every read that can need a redistribution, keyed by the base tensor it reads.

    A read of a same-size view that runs in its producer's layout (a merged follower) is
    moved to the view's input, so that reads through ``x``, ``x.t()`` and ``x.view(...)``
    share one all-gather of ``x`` — as Megatron reuses one gathered input.  A merged
    follower's read of its own producer needs no redistribution and is dropped.
    """
    def transparent(name: str) -> bool:
        v = graph.node(name)
        src = graph.tensor(resolve(v.inputs[0], alias)) if v.inputs else None
        return (v.is_view and len(v.inputs) == 1 and v.out is not None and src is not None
                and v.out.numel == src.numel and unit_of.get(name) == unit_of.get(resolve(v.inputs[0], alias).node))

    def base(ref: TensorRef, views: tuple[str, ...]) -> tuple[TensorRef, tuple[str, ...]]:
        while ref.index == 0 and ref.node in unit_of and transparent(ref.node):
            views = views + (ref.node,)
            ref = resolve(graph.node(ref.node).inputs[0], alias)
        return ref, views

    reads: dict[TensorRef, list[Read]] = {}
    for n in nodes:
        for i, r in enumerate(n.inputs):
            r = resolve(r, alias)
            if n.name in unit_of and unit_of[n.name] == unit_of.get(r.node) and i == 0 and len(n.inputs) == 1:
                continue                      # a merged follower reads its producer in place
            ref, views = base(r, ())
            reads.setdefault(ref, []).append(Read(n.name, i, r, views=views))
    for grad, param in _grad_sinks(graph, alias):
        ref, views = base(grad, ())
        reads.setdefault(ref, []).append(Read(param, 0, grad, sink=param, views=views))
    for out, placeholder in _boundary(graph, alias):
        ref, views = base(out, ())
        reads.setdefault(ref, []).append(Read(placeholder, -1, out, views=views))
    return reads


def resolved_reads(g: OpGraph, reads: dict[TensorRef, list[Read]],
                   strategies_of: Callable[[Read], Iterable[Callable[[str], Strategy]]],
                   inverse: ViewInverse) -> dict[TensorRef, list[tuple[Read, list[str | None]]]]:
    """tensor -> [(read, [needed layout per strategy of the reader's unit])].

    A read whose layouts cannot all be mapped back through its views stays on the
    tensor it reads directly."""
    out: dict[TensorRef, list[tuple[Read, list[str | None]]]] = {}
    for ref in sorted(reads, key=lambda r: (r.node, r.index)):
        for read in reads[ref]:
            pls = [required(g, read, f, inverse) for f in strategies_of(read)]
            target = ref
            if read.views and any(p is None for p in pls):
                read = Read(read.reader, read.index, read.own, read.sink, ())
                pls = [required(g, read, f, inverse) for f in strategies_of(read)]
                target = read.own
            out.setdefault(target, []).append((read, pls))
    return out


def _grad_sinks(graph: OpGraph, alias: dict[str, str]) -> list[tuple[TensorRef, str]]:
    """(gradient tensor, parameter placeholder) for every parameter gradient the block returns."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    roles = graph.output_roles or ()
    return [(resolve(r, alias), role[len(PARAM_GRAD_ROLE):]) for r, role in zip(out_node.inputs, roles)
            if role.startswith(PARAM_GRAD_ROLE)]


def _boundary(graph: OpGraph, alias: dict[str, str]) -> list[tuple[TensorRef, str]]:
    """Blocks repeat: this block's output feeds the next block's input placeholder, and the
    gradient of this block's input is the tangent of the block below."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    roles = graph.output_roles or tuple("activation" for _ in out_node.inputs)
    inputs = [n.name for n in graph.nodes if n.op == "placeholder" and n.role == "input"]
    tangents = [n.name for n in graph.nodes if n.op == "placeholder" and n.role == "tangent"]
    acts = [resolve(r, alias) for r, role in zip(out_node.inputs, roles) if role == "activation"]
    pairs = []
    if inputs and len(inputs) == len(acts):
        pairs += list(zip(acts, inputs))
        for r, role in zip(out_node.inputs, roles):
            target = role[len(INPUT_GRAD_ROLE):] if role.startswith(INPUT_GRAD_ROLE) else None
            if target in inputs and len(tangents) == len(inputs):
                pairs.append((resolve(r, alias), tangents[inputs.index(target)]))
    return pairs


def required(g: OpGraph, read: Read, strategy_of: Callable[[str], Strategy], inverse: ViewInverse) -> str | None:
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


def view_inverse(g: OpGraph) -> ViewInverse:
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


def read_group(g: OpGraph, read: Read) -> int:
    """Reads in one phase share a redistribution; backward redistributes a saved tensor again."""
    if read.sink:
        return BACKWARD_GROUP
    n = g.node(read.reader)
    return FORWARD_GROUP if n.phase == "forward" and n.role != "tangent" else BACKWARD_GROUP


def read_phase(g: OpGraph, read: Read) -> str:
    if read.sink:
        return "wgrad"
    n = g.node(read.reader)
    if n.phase == "forward" and n.role != "tangent":
        return "forward"
    return "wgrad" if n.wgrad else "backward"


