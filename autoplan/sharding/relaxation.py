r"""The block ILP's LP relaxation, solved first: where its optimum is integral it is the ILP's.

Relax ``x, e, w ∈ {0,1}`` of ``ilp.py``'s formulation to ``[0, 1]`` and solve the linear program
with OR-Tools' GLOP (dual simplex, deterministic).  Every relaxed optimum is a lower bound on
the ILP's; when the x of that optimum are all 0 or 1, the assignment they pick is feasible for
the ILP, and its objective (``ilp.evaluate``, recomputed from the assignment, not read off the
LP) equals the bound, it is an optimal ILP solution — the certificate ``solve_relaxation``
checks (to ``REL_TOL`` of the objective, beside which CP-SAT's nanosecond rounding of every
cost, ``ilp._SCALE``, is coarser).  Otherwise it returns None and the caller solves the ILP.

Why it pays: the edge formulation's constraints (one strategy per node, the edge marginals of
every producer–consumer pair) make the relaxation integral on the block graphs we trace — on
all 264 distinct ILPs of DeepSeek-V3 on h100x2048, where GLOP takes 1.9 s against CP-SAT's
9.4 s (``experiments/bench_search.py --worst`` times the whole search).  Among tied optima it
may land on another assignment than CP-SAT would; both are optimal.

Only problems without a memory row go here (a knapsack row makes the relaxation fractional);
the model's variables and constraints are built once per problem structure (``ilp._structure``)
and copied, as the CP-SAT skeleton is, so a solve sets only the objective.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from autoplan.sharding.ilp import (
    _SKELETONS_LIMIT,
    IlpProblem,
    IlpSolution,
    Skeleton,
    built_variables,
    evaluate,
    feasible,
    per_structure,
)
from costmodels.memo import Table

if TYPE_CHECKING:
    from ortools.linear_solver.python import model_builder_helper


INTEGRAL_TOL = 1e-6      # an x within this of 0 or 1 is read as that integer
REL_TOL = 1e-9           # the certificate: the assignment's objective within this of the LP bound
# dual simplex (1.9 s instead of 2.4 s on DeepSeek-V3's 264 ILPs) with feasibility tolerances
# far below GLOP's defaults (1e-6 primal and dual): at the defaults one of those 264 optima came
# out 3e-9 above CP-SAT's, at 1e-12 none is above it by more than 3e-16 (relative)
GLOP_PARAMETERS = "use_dual_simplex: true primal_feasibility_tolerance: 1e-12 dual_feasibility_tolerance: 1e-12"


class _Rows:
    """``ilp._build``'s backend api recording the LP: variable count, rows (vars, coeffs, lo, hi)
    and the variables fixed to 0."""

    def __init__(self) -> None:
        self.count = 0
        self.rows: list[tuple[list[int], list[float], float, float]] = []
        self.fixed: list[int] = []

    def boolvar(self, name: str) -> int:
        self.count += 1
        return self.count - 1

    def exactly_one(self, literals: list[int]) -> None:
        self.rows.append((list(literals), [1.0] * len(literals), 1.0, 1.0))

    def add_eq(self, lhs: list[int], rhs: list[int]) -> None:
        terms: dict[int, float] = {}
        for v in lhs:
            terms[v] = terms.get(v, 0.0) + 1.0
        for v in rhs:
            terms[v] = terms.get(v, 0.0) - 1.0
        kept = sorted(v for v, c in terms.items() if c)
        self.rows.append((kept, [terms[v] for v in kept], 0.0, 0.0))

    def add_ge(self, a: int, b: int) -> None:
        self.rows.append(([a, b], [1.0, -1.0], 0.0, float("inf")))

    def fix0(self, v: int) -> None:
        self.fixed.append(v)


_LP_SKELETONS: Table[Skeleton[model_builder_helper.ModelBuilderHelper, int]] = Table(
    "relaxation.skeletons", _SKELETONS_LIMIT, compare=Skeleton.same_model)


def _lp_skeleton(problem: IlpProblem) -> Skeleton[model_builder_helper.ModelBuilderHelper, int]:
    """The LP ``Skeleton`` (a ModelBuilderHelper's variables and rows) of ``problem``'s structure,
    built on first sight."""
    from ortools.linear_solver.python import model_builder_helper as mb

    def make() -> Skeleton[model_builder_helper.ModelBuilderHelper, int]:
        rows = _Rows()
        x, w = built_variables(problem, rows)
        model = mb.ModelBuilderHelper()
        upper = np.ones(rows.count)
        upper[rows.fixed] = 0.0
        # ignore: the stub spells the arrays ndarray[float64, ...] (dtype in the shape slot): no array matches
        model.add_var_array_with_bounds(
            np.zeros(rows.count), upper, np.zeros(rows.count, dtype=bool), "")  # type: ignore[arg-type]
        for variables, coeffs, lo, hi in rows.rows:
            row = model.add_linear_constraint()
            model.set_constraint_lower_bound(row, lo)
            model.set_constraint_upper_bound(row, hi)
            for v, c in zip(variables, coeffs):
                model.add_term_to_constraint(row, v, c)
        return Skeleton(model, x, w)
    return per_structure(_LP_SKELETONS, problem, make)


def solve_relaxation(problem: IlpProblem) -> IlpSolution | None:
    """The ILP's optimum read off its LP relaxation, or None where the relaxation does not
    certify one (module docstring); None for a problem with a memory row."""
    from ortools.linear_solver.python import model_builder_helper as mb

    if problem.memory_budget is not None:
        return None
    start = time.perf_counter()
    skeleton = _lp_skeleton(problem)
    costs: dict[int, float] = {}
    for c, var in skeleton.objective(problem):
        costs[var] = costs.get(var, 0.0) + c
    model = mb.ModelBuilderHelper()
    model.overwrite_model(skeleton.model)
    ordered = sorted(costs)
    model.set_objective_coefficients(ordered, [costs[v] for v in ordered])
    solver = mb.ModelSolverHelper("glop")
    solver.set_solver_specific_parameters(GLOP_PARAMETERS)
    solver.solve(model)
    if solver.status() != mb.SolveStatus.OPTIMAL:      # only an optimal LP point's value is a bound
        return None
    values = solver.variable_values()
    rows = [[float(values[v]) for v in row] for row in skeleton.x]
    if any(abs(val - round(val)) > INTEGRAL_TOL for row in rows for val in row):
        return None
    choice = tuple(max(range(len(row)), key=lambda s: row[s]) for row in rows)
    if not feasible(problem, choice):        # the LP's rows hold it; checked on the assignment itself
        return None
    bound = float(solver.objective_value())
    objective = evaluate(problem, choice)
    if objective > bound + REL_TOL * max(abs(bound), 1e-30):
        return None
    # certified: what separates the two is summation order (both sum the same costs), so the gap is 0
    # as CP-SAT reports it for an optimum
    return IlpSolution(choice, objective, objective, "optimal", time.perf_counter() - start, "glop")
