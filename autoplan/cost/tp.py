"""Tensor (and sequence) parallelism: each block kind's layout on the tp axis, from the block ILP.

The ILP (``autoplan.sharding``) is solved once per (block kind, tp, sp, span of the tp group,
micro-batch, cp): the plan's own local shape, because the layout that wins depends on it (at
131K tokens on one rank gathering weights beats gathering activations; at cp=16 it does not;
GEMM efficiency, α–β collective times and divisibility are not linear in the token count).
Recomputation is left out of the solve on purpose: a ``Layout`` holds one placement per block
kind while recomputation may differ per pipeline stage (and the runtime does not re-shard a
checkpointed layer), so the layout is solved without recomputation and re-priced under the
stage's policy.  A plan's price never depends on which plans were priced before it: every
input the solution depends on is in the cache key.

Every tp collective sits on its layer's critical path (exposed = its time): Megatron's TP/SP
collectives are not overlapped with the GEMMs that consume them.
"""
from __future__ import annotations

from autoplan.axes import Axis
from autoplan.cost.comms import AxisPricer, Comms
from autoplan.cost.types import AxisCost, Comm, EstimateOptions
from autoplan.ir import OpGraph
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.sharding import BlockAssignment, BlockSharding, ShardingContext, price_assignment, solve_assignment
from autoplan.sharding.solve import LayoutPrices, layout_prices


class BlockLayouts:
    """The block ILP's solutions and their prices under plans, memoised."""

    def __init__(self, comms: Comms, options: EstimateOptions, *, enforce_rules: bool):
        """``enforce_rules``: the search's mode, where the ILP may not place a per-layer collective
        outside the NVLink domain; hand plans are priced as written (and flagged)."""
        self.comms = comms
        self.options = options
        self.enforce_rules = enforce_rules
        self.assignments: dict[tuple, BlockAssignment] = {}
        self._priced: dict[tuple, BlockSharding] = {}
        self._prices: dict[tuple, tuple[BlockAssignment, LayoutPrices]] = {}   # by layout: _priced's key less the policy
        self.max_gap = 0.0                   # over every block sharding priced so far

    def assignment_key(self, graph_key: str, plan: Plan, mesh: Mesh) -> tuple:
        """Everything the block ILP's solution depends on: (kind, tp, sp, tp span, mbs, cp)."""
        return (graph_key, plan.tp, plan.sp, self.comms.span(mesh.group(Axis.TP.value)), plan.mbs, plan.cp)

    def solve(self, graph: OpGraph, plan: Plan, mesh: Mesh) -> BlockAssignment:
        """Solve the block ILP at ``plan``'s local shape, without recomputation (not memoised)."""
        return solve_assignment(graph, self._context(plan, "none", mesh, self.comms.span(mesh.group(Axis.TP.value))))

    def sharding(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, mesh: Mesh) -> BlockSharding:
        """The block's tp layout under ``plan``, priced at the plan's micro-batch, cp and recompute."""
        span = self.comms.span(mesh.group(Axis.TP.value))
        layout = (graph_key, plan.tp, plan.sp, plan.mbs, plan.cp, span)     # the policies of one layout
        key = (*layout, recompute)                                             # share its prices
        hit = self._priced.get(key)
        if hit is None:
            akey = self.assignment_key(graph_key, plan, mesh)
            assignment = self.assignments.get(akey)
            if assignment is None:
                assignment = self.assignments[akey] = self.solve(graph, plan, mesh)
            ctx = self._context(plan, recompute, mesh, span)
            prices = self._prices.get(layout)
            if prices is None or prices[0] is not assignment:
                prices = self._prices[layout] = (assignment, layout_prices(graph, assignment, ctx))
            hit = price_assignment(graph, assignment, ctx, prices[1])
            self._priced[key] = hit
            self.max_gap = max(self.max_gap, hit.gap)
        return hit

    def _context(self, plan: Plan, recompute: str, mesh: Mesh, span) -> ShardingContext:
        forbid = span.level != "nvlink" and not self.options.allow_cross_domain
        return ShardingContext(tp=plan.tp, sp=plan.sp, pricer=AxisPricer(self.comms, mesh), mbs=plan.mbs,
                               cp=plan.cp, recompute=recompute, forbid_tp_collectives=forbid and self.enforce_rules,
                               backend=self.options.solver, time_limit_s=self.options.time_limit_s)


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
