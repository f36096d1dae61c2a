"""The LP relaxation the OR-Tools backend solves first: where it certifies an optimum, that
optimum is the ILP's (brute force on small random problems, CP-SAT on traced blocks); where it
does not, the ILP is solved as before."""
import pytest

from autoplan.sharding import ilp
from autoplan.sharding.ilp import IlpNode, IlpProblem, evaluate, solve
from autoplan.sharding.relaxation import solve_relaxation


def test_a_certified_relaxation_is_the_brute_force_optimum_and_the_rest_fall_back(random_problem, brute_force):
    certified, fell_back = 0, 0
    for seed in range(12):
        p = random_problem(seed)
        best = brute_force(p)
        relaxed = solve_relaxation(p)
        sol = solve(p, "cpsat")
        assert sol.status == "optimal"
        assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert evaluate(p, sol.choice) == pytest.approx(sol.objective, rel=1e-12)
        if relaxed is None:
            fell_back += 1
            assert sol.backend == "cpsat"               # a fractional relaxation: CP-SAT decides
        else:
            certified += 1
            assert relaxed.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
            assert relaxed.gap == pytest.approx(0.0, abs=1e-9)
            assert (sol.backend, sol.choice) == ("glop", relaxed.choice)
    # both paths are exercised by these seeds (seeds 8 and 11 relax to fractional optima)
    assert certified >= 6 and fell_back >= 1


def test_a_memory_row_is_left_to_the_ilp(random_problem):
    p = random_problem(1, memory=True)
    assert solve_relaxation(p) is None
    assert solve(p, "cpsat").backend == "cpsat"


def test_forbidden_choices_and_ties_hold_in_the_relaxation():
    p = IlpProblem(nodes=(IlpNode("a", (1.0, 0.0), forbidden=(1,)), IlpNode("b", (5.0, 0.0))),
                   tensors=(), ties=((0, 1, (0, 1)),))
    sol = solve_relaxation(p)
    assert sol is not None and sol.choice == (0, 0) and sol.objective == pytest.approx(6.0)


def test_traced_blocks_relax_to_the_cpsat_optimum(gpt_block, llama_block, h100):
    """On real block ILPs (SP on and off, tp 2, 4 and 8, mbs 1 and 4) the relaxation is integral,
    and its optimum is CP-SAT's (to CP-SAT's nanosecond rounding of every cost), the same
    answer twice."""
    from autoplan.sharding.prepare import prepare
    from autoplan.sharding.solve import build_problem
    for graph in (gpt_block, llama_block):
        for tp, sp, mbs in ((2, True, 1), (4, False, 1), (8, False, 4), (8, True, 4)):
            ctx = h100(tp, sp, mbs=mbs)
            problem = build_problem(prepare(graph, ctx), ctx)
            relaxed = solve_relaxation(problem)
            assert relaxed is not None and relaxed.backend == "glop"
            reference = ilp._solve_cpsat(problem, 30.0)
            assert reference.status == "optimal"
            assert relaxed.objective == pytest.approx(reference.objective, rel=1e-9, abs=1e-12)
            assert relaxed.objective <= reference.objective * (1 + 1e-12)
            assert solve_relaxation(problem).choice == relaxed.choice
