"""Tensor (and sequence) parallelism: each block kind's layout on the tp axis, from the block ILP.

The ILP (``autoplan.sharding``) is solved once per (block kind, tp, sp, span of the tp group,
micro-batch, cp): the plan's own local shape, because the layout that wins depends on it (at
131K tokens on one rank gathering weights beats gathering activations; at cp=16 it does not;
GEMM efficiency, α–β collective times and divisibility are not linear in the token count).
Recomputation is left out of the solve on purpose: a ``Layout`` holds one placement per block
kind while recomputation may differ per pipeline stage (and the runtime does not re-shard a
checkpointed layer), so the layout is solved without recomputation and re-priced under the
stage's policy.  A plan's price never depends on which plans were priced before it: every
input the solution depends on is in its key (``LayoutKey``; a priced layout's, ``ShardingKey``).

Every tp collective sits on its layer's critical path (exposed = its time): Megatron's TP/SP
collectives are not overlapped with the GEMMs that consume them — unless the engine overlaps
them (``EstimateOptions.tp_comm_overlap``: Megatron-Core with Transformer Engine's userbuffers,
``--tp-comm-overlap``, on in Megatron-Bridge's Llama recipes), which splits each sequence-parallel
all-gather into chunks pipelined with the GEMM reading it and each reduce-scatter with the GEMM
producing it (``overlapped``): per phase the SP collectives are exposed only by what exceeds the
phase's non-attention compute; all-reduces and all-to-alls stay exposed.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from autoplan.axes import Axis
from autoplan.cost.prices import AxisPricer, Prices
from autoplan.cost.types import AxisCost, Comm, EstimateOptions
from autoplan.ir import OpGraph, Strategy
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.sharding import BlockAssignment, BlockSharding, ShardingContext, price_assignment, solve_assignment
from autoplan.sharding.solve import LayoutPrices, layout_prices
from autoplan.sharding.types import SOLVE_SECONDS
from costmodels.memo import Table
from costmodels.precision import is_low_precision
from topologies.cluster import GroupSpan

LAYOUTS_KEPT = 100_000       # solved and priced layouts kept (a search meets a few hundred)


class LayoutKey(NamedTuple):
    """Everything the block ILP's solution depends on besides the Estimator's options: the graph
    (block kind, "@pre" or "@post"), the local shape it is solved at, the span of its tp group
    (what the tp collectives' seconds read of the ranks) and its GEMMs' precision
    (``gemm_precision``)."""

    graph: str
    tp: int
    sp: bool
    span: GroupSpan
    mbs: int
    cp: int
    precision: str = "bf16"

    @staticmethod
    def of(graph: str, plan: Plan, span: GroupSpan) -> LayoutKey:
        return LayoutKey(graph, plan.tp, bool(plan.sp), span, plan.mbs, plan.cp, gemm_precision(graph, plan))


def gemm_precision(graph: str, plan: Plan) -> str:
    """The precision of a graph's linear GEMMs under ``plan``: the plan's in the blocks, bf16 in
    "@pre" (the embedding) and "@post" (the LM head: Transformer Engine and torchao keep it bf16)."""
    return "bf16" if graph in ("@pre", "@post") else plan.precision


def recompute_precision(fp8_recompute: str, precision: str) -> str:
    """The precision a recomputed linear layer of a graph whose GEMMs run at ``precision`` reruns
    in (``ShardingContext.recompute_precision``): bf16 for an FP8 graph whose engine recomputes
    outside its FP8 context (``EstimateOptions.fp8_recompute``), else "" (its own)."""
    return "bf16" if fp8_recompute == "bf16" and is_low_precision(precision) else ""


class ShardingKey(NamedTuple):
    """A solved layout priced under one recompute policy."""

    layout: LayoutKey
    recompute: str


class BlockLayouts:
    """The block ILP's solutions and their prices under plans, memoised."""

    def __init__(self, prices: Prices, options: EstimateOptions, *, enforce_rules: bool):
        """``enforce_rules``: the search's mode, where the ILP may not place a per-layer collective
        outside the NVLink domain; hand plans are priced as written (and flagged)."""
        self.prices = prices
        self.options = options
        self.enforce_rules = enforce_rules
        self.assignments: Table[BlockAssignment] = Table("layouts.assignments", LAYOUTS_KEPT, volatile=SOLVE_SECONDS)
        self._priced: Table[BlockSharding] = Table("layouts.priced", LAYOUTS_KEPT, volatile=SOLVE_SECONDS)
        # a layout's prices under every policy, with the assignment they were read off
        self._prices: Table[tuple[BlockAssignment, LayoutPrices]] = Table("layouts.prices", LAYOUTS_KEPT,
                                                                          volatile=SOLVE_SECONDS)

    def assignment_key(self, graph_key: str, plan: Plan, mesh: Mesh) -> LayoutKey:
        """The ``LayoutKey`` of one graph under ``plan``."""
        return LayoutKey.of(graph_key, plan, self.prices.span(mesh.group(Axis.TP.value)))

    def store(self, solved: list[tuple[LayoutKey, BlockAssignment]]) -> None:
        """Remember ILP solutions solved elsewhere (the search's worker processes) under their keys."""
        for key, assignment in solved:
            self.assignments.put(key, assignment)

    def solve(self, graph_key: str, graph: OpGraph, plan: Plan, mesh: Mesh) -> BlockAssignment:
        """Solve the block ILP at ``plan``'s local shape, without recomputation (not memoised)."""
        return solve_assignment(graph, self._context(plan, "none", mesh, self.assignment_key(graph_key, plan, mesh)))

    def sharding(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, mesh: Mesh) -> BlockSharding:
        """The block's tp layout under ``plan``, priced at the plan's micro-batch, cp and recompute."""
        layout = self.assignment_key(graph_key, plan, mesh)

        def priced() -> BlockSharding:
            assignment = self._assignment(layout, graph_key, graph, plan, mesh)
            ctx = self._context(plan, recompute, mesh, layout)
            prices = self._prices.get(layout, lambda: (assignment, layout_prices(graph, assignment, ctx)))
            if prices[0] is not assignment:          # solved again since (its table started again)
                prices = (assignment, layout_prices(graph, assignment, ctx))
                self._prices.put(layout, prices)
            return price_assignment(graph, assignment, ctx, prices[1])
        return self._priced.get(ShardingKey(layout, recompute), priced)

    def pricing(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str,
                mesh: Mesh) -> tuple[ShardingContext, dict[str, Strategy]]:
        """What ``sharding`` prices the graph's layout with: its context and each node's strategy
        (``cost.loss`` prices the ops it replaces with them)."""
        layout = self.assignment_key(graph_key, plan, mesh)
        return (self._context(plan, recompute, mesh, layout),
                self._assignment(layout, graph_key, graph, plan, mesh).choice)

    def _assignment(self, layout: LayoutKey, graph_key: str, graph: OpGraph, plan: Plan, mesh: Mesh) -> BlockAssignment:
        """The layout's block-ILP solution, solved on a miss (``solve``)."""
        return self.assignments.get(layout, lambda: self.solve(graph_key, graph, plan, mesh))

    def _context(self, plan: Plan, recompute: str, mesh: Mesh, layout: LayoutKey) -> ShardingContext:
        forbid = layout.span.level != "nvlink" and not self.options.allow_cross_domain
        return ShardingContext(tp=plan.tp, sp=plan.sp, pricer=AxisPricer(self.prices, mesh), mbs=plan.mbs,
                               cp=plan.cp, recompute=recompute, precision=layout.precision,
                               recompute_precision=recompute_precision(self.options.fp8_recompute, layout.precision),
                               forbid_tp_collectives=forbid and self.enforce_rules,
                               backend=self.options.solver, time_limit_s=self.options.time_limit_s)


def overlapped(tp: AxisCost, windows: tuple[float, float]) -> AxisCost:
    """``tp`` with its sequence-parallel collectives overlapped (module docstring): per phase
    (forward, backward) they are exposed by max(0, their seconds − the phase's ``windows``
    seconds: its GEMM and element-wise compute, attention left out), each by its share."""
    comms, exposed = [], {"forward": 0.0, "backward": 0.0}
    sp = {ph: sum(c.seconds for c in tp.comms if c.phase == ph and c.purpose == "sp") for ph in exposed}
    left = {ph: max(0.0, sp[ph] - w) / sp[ph] if sp[ph] else 0.0 for ph, w in zip(("forward", "backward"), windows)}
    for c in tp.comms:
        e = c.seconds * left[c.phase] if c.purpose == "sp" else c.exposed_s
        comms.append(replace(c, exposed_s=e))
        exposed[c.phase] += e
    return AxisCost(exposed["forward"], exposed["backward"], tuple(comms))


def tp_cost(bs: BlockSharding, plan: Plan) -> AxisCost:
    """The block's tp collectives per micro-batch, all exposed; reduce-scatters and all-gathers are
    sequence parallelism's when SP is on."""
    comms, fwd, bwd = [], 0.0, 0.0
    for c in bs.collectives:
        phase = "forward" if c.phase == "forward" else "backward"
        purpose = "sp" if plan.sp and c.kind in ("reduce_scatter", "all_gather") else "tp"
        comms.append(Comm(Axis.TP.value, c.kind, c.nbytes, c.seconds, c.seconds, phase, purpose=purpose))
        if phase == "forward":
            fwd += c.seconds
        else:
            bwd += c.seconds
    return AxisCost(fwd, bwd, tuple(comms))
