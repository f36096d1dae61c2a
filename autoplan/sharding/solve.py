"""Build the block ILP from a prepared graph, solve it, and price the solved layout back.

``solve_assignment(graph, ctx)`` → ``BlockAssignment`` (a strategy per node) and
``price_assignment(graph, assignment, ctx)`` → ``BlockSharding`` (compute seconds by phase,
tp collectives, saved bytes, parameter placements).  The ILP (``ilp.py``) is built from the
same ``price`` functions the read-back uses, over the same units and reads.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from autoplan.ir import OpGraph, OpNode, Strategy, TensorRef
from autoplan.routing import routed_region
from autoplan.sharding import ilp
from autoplan.sharding.local import local_bytes
from autoplan.sharding.placements import is_shard, redistribution
from autoplan.sharding.prepare import (
    Prepared,
    Read,
    dedupe_views,
    is_unary_elementwise,
    prepare,
    read_group,
    read_phase,
    reads_of,
    resolve,
    resolved_reads,
    view_inverse,
)
from autoplan.sharding.price import (
    NodeCost,
    OpCollective,
    Redistribution,
    memory_price,
    node_cost,
    node_prices,
    outside_fp8_seconds,
    redistribution_cost,
    redistribution_pricer,
    redistribution_runs,
)
from autoplan.sharding.strategies import replicated
from autoplan.sharding.types import SOLVE_SECONDS, BlockAssignment, BlockSharding, Collective, ShardingContext
from costmodels.memo import Table, memo

_EMPTY_SIZE = {"nodes": 0, "x_vars": 0, "e_vars": 0, "w_vars": 0, "constraints": 0}


def build_problem(prep: Prepared, ctx: ShardingContext) -> ilp.IlpProblem:
    """``ilp.IlpProblem``: per unit, the cost of each strategy (constraint 1 and the first objective
    term); per tensor, its placements and readers (constraint 2) and the priced redistributions
    (the second objective term; forbidden under the NVLink rule, constraint 5).  Parameters tie
    to their gradient through the sink reads, blocks to the next block through the boundary
    reads, so constraints 3–4 of ``ilp.py`` are not needed here.  What no context changes — the
    tensors, their placements, readers and possible redistributions — is derived once per
    prepared graph (``_tensor_shapes``); only the seconds are priced here."""
    g = prep.graph
    price = memory_price(g, ctx)
    nodes = tuple(ilp.IlpNode(u.leader, *_unit_costs(g, u.strategies, ctx, price)) for u in prep.units)
    tensors = []
    seconds: dict[tuple[str, float], float] = {}
    for shape in _tensor_shapes(prep):
        cost = redistribution_pricer(g, shape.ref, ctx, seconds)
        redist = tuple((a, b, grp, r.seconds * r.runs) for a, b, grp, pa, pb in shape.pairs
                       if (r := cost(pa, pb, grp)))
        forbidden = shape.forbidden if ctx.forbid_tp_collectives else ()
        tensors.append(ilp.IlpTensor(shape.name, shape.producer, shape.out_placement, shape.consumers, redist,
                                     forbidden))
    return ilp.IlpProblem(nodes, tuple(tensors))


@dataclass(frozen=True)
class _TensorShape:
    """What the ILP reads of one tensor that no ShardingContext changes."""

    ref: TensorRef
    name: str
    producer: int                                       # unit index
    out_placement: tuple[int, ...]                      # placement id per producer strategy
    consumers: tuple[tuple[int, tuple[int, ...], int], ...]   # (unit, placement id per its strategy, group)
    pairs: tuple[tuple[int, int, int, str, str], ...]   # (a, b, group, layout a, layout b): a ≠ b, a collective
    forbidden: tuple[tuple[int, int], ...]              # the (a, b) of pairs, under the NVLink rule


_TENSOR_SHAPES: Table[tuple[_TensorShape, ...]] = Table("sharding.tensor_shapes", 1024)


def _tensor_shapes(prep: Prepared) -> tuple[_TensorShape, ...]:
    """``_TensorShape`` of every tensor the ILP prices, memoised on the key ``prepare`` prepared
    it under (a preparation made outside ``prepare`` is not remembered)."""
    if prep.key is None:
        return _tensor_shapes_of(prep)
    return _TENSOR_SHAPES.get(prep.key, lambda: _tensor_shapes_of(prep))


def _tensor_shapes_of(prep: Prepared) -> tuple[_TensorShape, ...]:
    g = prep.graph

    def unit_strategies(read: Read) -> list[Callable[[str], Strategy]]:
        # ignore[misc]: mypy cannot infer the type of a lambda whose parameter has a default
        return [(lambda name, us=us: us[name])  # type: ignore[misc]
                for us in prep.units[prep.unit_of[read.sink or read.reader]].strategies]

    out = []
    for ref, rows_in in resolved_reads(g, prep.reads, unit_strategies, view_inverse(g)).items():
        if g.tensor(ref) is None or ref.node not in prep.unit_of:
            continue
        pu = prep.unit_of[ref.node]
        ids: dict[str, int] = {}

        def pid(p: str, ids: dict[str, int] = ids) -> int:   # ids bound now: used in this iteration only
            return ids.setdefault(p, len(ids))

        out_pl = tuple(pid(us[ref.node].outputs[ref.index] or "R") for us in prep.units[pu].strategies)
        rows = tuple((prep.unit_of[read.sink or read.reader], tuple(pid(p or "R") for p in pls), read_group(g, read))
                     for read, pls in rows_in)
        names = {v: k for k, v in ids.items()}
        pairs = tuple((a, b, grp, names[a], names[b]) for grp in sorted({r[2] for r in rows})
                      for a in names for b in names if a != b and redistribution(names[a], names[b]) is not None)
        out.append(_TensorShape(ref, f"{ref.node}:{ref.index}", pu, out_pl, rows, pairs,
                                tuple(sorted({(a, b) for a, b, *_ in pairs}))))
    return tuple(out)


def _unit_costs(g: OpGraph, strategies: list[dict[str, Strategy]], ctx: ShardingContext,
                price: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(objective seconds, memory bytes) of each strategy of one unit.  Unit strategies that
    share a member's strategy (followers of leaders with one output layout) price it once."""
    costs, mems = [], []
    priced: dict[tuple[str, Strategy], NodeCost] = {}
    for us in strategies:
        sec = mem = state = 0.0
        for name, s in us.items():
            c = priced.get((name, s))
            if c is None:
                c = priced[(name, s)] = node_cost(g, g.node(name), s, ctx)
            sec += c.seconds * c.runs
            sec += sum(x.seconds for x in c.intrinsic)
            mem += c.saved_bytes
            state += c.state_bytes
        costs.append(sec + ctx.memory_weight_s_per_byte * mem + price * state)
        mems.append(mem + state)
    return tuple(costs), tuple(mems)


def solve_assignment(graph: OpGraph, ctx: ShardingContext) -> BlockAssignment:
    """Solve the block ILP for ``ctx``: the chosen strategy of every node.

    With tp = 1 there is nothing to choose: every op runs replicated."""
    if ctx.tp == 1:
        choice: dict[str, Strategy] = {n.name: replicated(n) for n in graph.nodes if n.op != "output"}
        return BlockAssignment(choice, 0.0, 0.0, 0.0, "optimal", dict(_EMPTY_SIZE))
    prep = prepare(graph, ctx)
    problem = build_problem(prep, ctx)
    sol = solve_problem(problem, ctx.backend, ctx.time_limit_s)
    choice = {}
    for ui, u in enumerate(prep.units):
        choice.update(u.strategies[sol.choice[ui]])
    for dup, kept in prep.alias.items():
        choice[dup] = choice[kept]
    return BlockAssignment(choice, sol.objective, sol.gap, sol.solve_seconds, sol.status, problem.size)


@memo(4096, volatile=SOLVE_SECONDS)
def solve_problem(problem: ilp.IlpProblem, backend: str, time_limit_s: float) -> ilp.IlpSolution:
    """``ilp.solve``, remembered by exactly what its answer depends on: the problem itself (every
    cost, placement, read and forbidden choice, the memory row) and the solver settings.  The
    backends are deterministic for one model (CP-SAT: one worker, a fixed seed and a
    deterministic time limit), so an equal problem gets the equal answer without solving
    again.  Contexts meet on one problem where nothing they differ in reaches the ILP: e.g.
    a head without attention (``@post``) prices tokens per GPU, ``mbs / cp``, alone, so
    (mbs 2, cp 2) is (mbs 1, cp 1) there whenever the local dims divide alike."""
    return ilp.solve(problem, backend, time_limit_s)


@dataclass(frozen=True)
class LayoutPrices:
    """What pricing a layout reads of a context besides its recompute policy: per priced node
    (``_LayoutReads.nodes``' order) ``price.node_prices``, per redistribution its collective run once."""

    nodes: tuple[tuple[float, tuple[OpCollective, ...]], ...]
    redistributions: tuple[Redistribution, ...]


def layout_prices(graph: OpGraph, assignment: BlockAssignment, ctx: ShardingContext) -> LayoutPrices:
    """``LayoutPrices`` of ``assignment`` under ``ctx`` (its recompute policy is not read): what
    ``price_assignment`` at every policy of one (tp, sp, mbs, cp, tp span) shares."""
    shape = _layout_reads(graph, assignment)
    once = replace(ctx, recompute="none")
    routed = routed_region(graph)
    # ignore[misc]: never None, _redistributions keeps only pairs that need a collective
    return LayoutPrices(tuple((0.0, ()) if n.name in routed else node_prices(n, s, ctx) for n, s in shape.nodes),
                        tuple(redistribution_cost(graph, ref, a, b, grp, once)  # type: ignore[misc]
                              for ref, a, b, grp, _, _ in shape.redistributions))


def _redistribution_collectives(g: OpGraph, shape: _LayoutReads, prices: LayoutPrices,
                                ctx: ShardingContext) -> list[Collective]:
    """The layout's redistributions as collectives, each run again in backward when its
    producer is recomputed (``redistribution_runs``)."""
    out: list[Collective] = []
    for (ref, _a, _b, grp, phase, label), once in zip(shape.redistributions, prices.redistributions):
        r = replace(once, runs=redistribution_runs(g, ref, grp, ctx.recompute))
        if r.runs == 2:
            out.append(Collective(r.kind, r.nbytes, "backward", label + " [recompute]", r.seconds))
        out.append(Collective(r.kind, r.nbytes, phase, label, r.seconds))
    return out

def _bytes_of(kept: list[tuple[str, float]], nodes: Collection[str]) -> float:
    """Of the saved bytes ``kept`` (node, bytes), those of ``nodes``, summed in ``kept``'s order."""
    total = 0.0
    for name, nbytes in kept:
        if name in nodes:
            total += nbytes
    return total


def price_assignment(graph: OpGraph, assignment: BlockAssignment, ctx: ShardingContext,
                     prices: LayoutPrices | None = None) -> BlockSharding:
    """Price a solved assignment under ``ctx``.

    Micro-batch, cp and recompute may differ from the ones it was solved at: every cost
    scales with them and the layout stays the best one (tested).  What does not depend on
    ``ctx`` — the priced nodes and the redistributions the layout implies — is derived once
    per (graph, assignment) (``_layout_reads``); only their seconds are priced here, or taken
    from ``prices`` (``layout_prices`` at ``ctx`` but another recompute policy)."""
    g = graph
    chosen = assignment.choice
    shape = _layout_reads(g, assignment)
    prices = prices if prices is not None else layout_prices(g, assignment, ctx)
    fwd = bwd = wgd = rec = saved = 0.0
    kept: list[tuple[str, float]] = []   # (node, saved bytes), in pricing order
    launches = [0, 0]                    # kernels issued in forward, in backward (+ recompute)
    collectives: list[Collective] = []
    outside = outside_fp8_seconds(g, shape.nodes, ctx)   # GEMMs an FP8 engine reruns outside FP8
    for (n, s), priced in zip(shape.nodes, prices.nodes):
        c = node_cost(g, n, s, ctx, priced)
        again = outside.get(n.name, c.seconds)           # a recomputed run, or a backward one
        if n.phase == "forward":
            fwd += c.seconds
        elif n.wgrad:
            wgd += again
        else:
            bwd += again
        if c.runs == 2:
            bwd += again
            rec += again
        if n.op != "placeholder" and not n.is_view:
            launches[n.phase != "forward"] += 1
            launches[1] += c.runs - 1
        saved += c.saved_bytes
        kept.append((n.name, c.saved_bytes))
        phase = "forward" if n.phase == "forward" else "backward"
        collectives += [Collective(x.kind, x.nbytes, phase, f"{n.module or n.op}:{n.name} (vocab-parallel)", x.seconds)
                        for x in c.intrinsic]
    collectives += _redistribution_collectives(g, shape, prices, ctx)
    held = sum(local_bytes(g.tensor(r), chosen[r.node].outputs[r.index], ctx.tp, ctx.mbs, ctx.cp) for r in shape.held)  # type: ignore[arg-type,misc]  # graph tensors
    params, param_numel = _param_placements(g, chosen, ctx.tp)
    return BlockSharding(
        strategies={k: v.name for k, v in sorted(chosen.items())},
        placements={k: (v.outputs[0] or "-") if v.outputs else "-" for k, v in sorted(chosen.items())},
        param_placements=dict(sorted(params.items())),  # type: ignore[arg-type]  # a param's placement is not None
        collectives=tuple(collectives),
        forward_s=fwd, backward_s=bwd, wgrad_s=wgd, recompute_s=rec, saved_bytes=saved, wgrad_held_bytes=held,
        b_freed_bytes=_bytes_of(kept, g.freed_at_input_grad_nodes()),
        wgrad_input_bytes=_bytes_of(kept, g.wgrad_input_nodes()),
        forward_launches=launches[0], backward_launches=launches[1],
        routed_saved_bytes=_bytes_of(kept, routed_region(g)),
        param_numel=param_numel, objective_s=assignment.objective_s, gap=assignment.gap,
        solve_seconds=assignment.solve_seconds, ilp_size=assignment.ilp_size,
    )


def _param_placements(g: OpGraph, chosen: dict[str, Strategy], tp: int) -> tuple[dict[str, str | None], int]:
    """(parameter name → its placement, elements one GPU holds of them) under ``chosen``."""
    params = {}
    param_numel = 0
    for n in g.params():
        pl = chosen[n.name].outputs[0]
        params[n.param or n.name] = pl
        param_numel += n.out.numel // (tp if is_shard(pl) else 1)  # type: ignore[union-attr]  # a param has one
    return params, param_numel


@dataclass(frozen=True)
class _LayoutReads:
    """What pricing a layout reads that no ShardingContext changes."""

    nodes: tuple[tuple[OpNode, Strategy], ...]          # priced nodes (views deduplicated) and their strategy
    redistributions: tuple[tuple[TensorRef, str, str, int, str, str], ...]   # (tensor, from, to, group, phase, label)
    held: tuple[TensorRef, ...]                         # ``OpGraph.wgrad_held_outputs`` by (node name, index)


@memo(4096, volatile=SOLVE_SECONDS)
def _layout_reads(g: OpGraph, assignment: BlockAssignment) -> _LayoutReads:
    """``_LayoutReads`` of one (graph, assignment), memoised on the pair (each hashed whole, once)."""
    chosen = assignment.choice
    alias = dedupe_views(g)
    nodes = tuple((g.node(name), s) for name, s in chosen.items() if name not in alias)
    out = _LayoutReads(nodes, tuple(_redistributions(g, chosen, alias)),
                       tuple(sorted(g.wgrad_held_outputs(), key=lambda r: (r.node, r.index))))
    return out


def _redistributions(g: OpGraph, chosen: dict[str, Strategy],
                     alias: dict[str, str]) -> list[tuple[TensorRef, str, str, int, str, str]]:
    """The tp redistributions the chosen layouts imply, one per (tensor, target layout, read
    group), as (tensor, from, to, group, phase, label); under full recomputation a forward
    one is rerun in backward (``redistribution_cost``'s runs)."""
    nodes = [n for n in g.nodes if n.name not in alias and n.op != "output"]
    reads = resolved_reads(g, reads_of(g, nodes, alias, _units_of_choice(nodes, alias, chosen, routed_region(g))),
                           lambda read: [chosen.__getitem__], view_inverse(g))
    out: list[tuple[TensorRef, str, str, int, str, str]] = []
    for ref, rows in reads.items():
        if g.tensor(ref) is None:
            continue
        outs = chosen[ref.node].outputs
        a = (outs[ref.index] if ref.index < len(outs) else None) or "R"
        seen: set[tuple[str, int]] = set()
        for read, (b,) in rows:
            grp = read_group(g, read)
            b = b or "R"
            if b == a or (b, grp) in seen or redistribution(a, b) is None:
                continue
            seen.add((b, grp))
            producer = g.node(ref.node)
            out.append((ref, a, b, grp, read_phase(g, read), f"{producer.module or producer.op}:{ref.node} ({a}->{b})"))
    return out


def _units_of_choice(nodes: list[OpNode], alias: dict[str, str], chosen: dict[str, Strategy],
                     routed: frozenset[str]) -> dict[str, int]:
    """Which ops run in their producer's layout under a chosen assignment (as merged followers);
    never a routed-expert node (``prepare._prepare``)."""
    unit_of: dict[str, int] = {}
    for i, n in enumerate(nodes):
        unit_of[n.name] = i
        if n.name in routed:
            continue
        if n.op != "placeholder" and len(n.inputs) == 1 and (n.is_view or is_unary_elementwise(n.strategies)):
            src = resolve(n.inputs[0], alias)
            outs = chosen[src.node].outputs if src.node in chosen else ()
            if src.index < len(outs) and outs[src.index] == chosen[n.name].inputs[0]:
                unit_of[n.name] = unit_of[src.node]
    return unit_of
