"""Operator-level sharding of one block on the tp axis: the block ILP, below everything that prices.

    assignment = solve_assignment(graph, ShardingContext(tp=8, sp=True, pricer=pricer))
    sharding = price_assignment(graph, assignment, ctx_at_the_plans_mbs_cp_and_recompute)

The block's joint forward+backward ATen graph (``ir.OpGraph``) carries, per node, the strategies
DTensor knows on a 1-D tp mesh.  ``prepare`` merges followers into ILP nodes and records the
reads that may redistribute; ``strategies`` filters what is legal (divisibility, SP rules, the
block boundary); ``price`` prices strategies and redistributions through a ``Pricer`` (op seconds,
collective seconds on a named axis), once for building and once for reading back; ``ilp`` is the
formulation and its two solver backends; ``solve`` ties them together.

Axes other than tp have fixed roles and enter only as scale factors: the block is traced at
micro-batch 1 and the whole sequence; a GPU holds ``mbs`` sequences and ``1/cp`` of each.
"""
from autoplan.sharding.solve import build_problem, price_assignment, solve_assignment
from autoplan.sharding.types import BlockAssignment, BlockSharding, Collective, Pricer, ShardingContext

__all__ = ["BlockAssignment", "BlockSharding", "Collective", "Pricer", "ShardingContext", "build_problem",
           "price_assignment", "solve_assignment"]
