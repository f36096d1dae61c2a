"""The ILP layer against brute force on small random problems, both backends."""
import pytest

from autoplan.sharding.ilp import IlpInfeasible, IlpNode, IlpProblem, IlpTensor, _solve_cpsat, evaluate, solve


@pytest.mark.parametrize("backend", ["cpsat", "cbc"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(backend, seed, random_problem, brute_force):
    p = random_problem(seed, memory=seed % 2 == 1)
    sol = solve(p, backend)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(brute_force(p), rel=1e-6, abs=1e-6)
    assert sol.gap == pytest.approx(0.0, abs=1e-6)


def test_redistribution_paid_once_for_many_consumers():
    # one producer with a single strategy (placement 0), three consumers that all need placement 1:
    # two in group 0 share one redistribution, the one in group 1 pays again
    consumers = ((1, (1,), 0), (2, (1,), 0), (3, (1,), 1))
    p = IlpProblem(
        nodes=(IlpNode("p", (0.0,)),) + tuple(IlpNode(f"c{i}", (1.0,)) for i in range(3)),
        tensors=(IlpTensor("t", 0, (0,), consumers, ((0, 1, 0, 5.0), (0, 1, 1, 5.0))),))
    for backend in ("cpsat", "cbc"):
        assert solve(p, backend).objective == pytest.approx(3.0 + 10.0)


def test_ties_and_forbidden():
    p = IlpProblem(
        nodes=(IlpNode("a", (1.0, 0.0), forbidden=(1,)), IlpNode("b", (5.0, 0.0))),
        tensors=(), ties=((0, 1, (0, 1)),))
    sol = solve(p)
    assert sol.choice == (0, 0) and sol.objective == pytest.approx(6.0)


def test_infeasible_memory_raises():
    p = IlpProblem(nodes=(IlpNode("a", (1.0,), (10.0,)),), tensors=(), memory_budget=1.0)
    for backend in ("cpsat", "cbc"):
        with pytest.raises(IlpInfeasible):
            solve(p, backend)


def test_unknown_backend():
    with pytest.raises(ValueError, match="cpsat"):
        solve(IlpProblem(nodes=(IlpNode("a", (1.0,)),), tensors=()), "gurobi")


def test_time_limit_returns_best_solution_with_its_gap(random_problem):
    p = random_problem(7, nodes=60, strategies=6, placements=4)
    # CP-SAT itself (``solve`` would first try the LP relaxation, which may certify the optimum)
    sol = _solve_cpsat(p, time_limit_s=0.002)
    again = _solve_cpsat(p, time_limit_s=0.002)
    assert sol.status in ("feasible", "optimal")
    assert sol.choice == again.choice                 # deterministic time: reproducible
    assert evaluate(p, sol.choice) == pytest.approx(sol.objective)
    if sol.status == "feasible":
        assert 0.0 < sol.gap < 1.0
        assert sol.bound <= sol.objective
    longer = _solve_cpsat(p, time_limit_s=1.0)
    assert longer.objective <= sol.objective + 1e-9


def _reference_cpsat_model(problem: IlpProblem):
    """The CP-SAT model written with operator-overloaded sums, as ``_cpsat_model`` was before
    it called CP-SAT directly: the reference its proto must equal."""
    from ortools.sat.python import cp_model

    from autoplan.sharding.ilp import _SCALE, _build, _greedy_choice

    m = cp_model.CpModel()

    class Api:
        boolvar = staticmethod(m.NewBoolVar)
        exactly_one = staticmethod(m.AddExactlyOne)

        @staticmethod
        def add_eq(lhs, rhs):
            m.Add(sum(lhs) == sum(rhs))

        @staticmethod
        def add_ge(a, b):
            m.AddImplication(b, a)

        @staticmethod
        def fix0(v):
            m.Add(v == 0)

    x, objective = _build(problem, Api)
    if problem.memory_budget is not None:
        unit = max(problem.memory_budget, 1e-30) / 1e6
        m.Add(sum(int(round(mem / unit)) * x[n][s] for n, node in enumerate(problem.nodes)
                  for s, mem in enumerate(node.memory) if mem) <= 1_000_000)
    m.Minimize(sum(int(round(c * _SCALE)) * v for c, v in objective))
    for n, best in enumerate(_greedy_choice(problem)):
        for s, var in enumerate(x[n]):
            m.AddHint(var, s == best)
    return m


def _with_forbidden(p: IlpProblem) -> IlpProblem:
    import dataclasses
    nodes = tuple(dataclasses.replace(n, forbidden=(1,)) if i % 2 else n for i, n in enumerate(p.nodes))
    tensors = tuple(dataclasses.replace(t, forbidden_redist=((0, 1), (2, 0))) for t in p.tensors)
    return dataclasses.replace(p, nodes=nodes, tensors=tensors)


@pytest.mark.parametrize("seed", range(8))
def test_cpsat_model_is_the_overloaded_one_proto_for_proto(seed, random_problem):
    from autoplan.sharding.ilp import _cpsat_model
    p = random_problem(seed, nodes=7, strategies=4, memory=seed % 2 == 1)
    for problem in (p, _with_forbidden(p)):
        assert str(_cpsat_model(problem)[0].Proto()) == str(_reference_cpsat_model(problem).Proto())


def test_cpsat_model_of_a_traced_block_is_the_overloaded_one(gpt_block, llama_block, h100):
    """The real block ILPs (SP on and off, tp 2 and 8, mbs 1 and 4): the same model proto."""
    from autoplan.sharding.ilp import _cpsat_model
    from autoplan.sharding.prepare import prepare
    from autoplan.sharding.solve import build_problem
    make = h100
    for graph in (gpt_block, llama_block):
        for tp, sp, mbs in ((2, True, 1), (8, False, 4), (8, True, 4)):
            ctx = make(tp, sp, mbs=mbs)
            problem = build_problem(prepare(graph, ctx), ctx)
            assert str(_cpsat_model(problem)[0].Proto()) == str(_reference_cpsat_model(problem).Proto())


def _cpsat_default_presolve(problem: IlpProblem):
    """CP-SAT on ``problem`` as ``_solve_cpsat`` runs it, but with CP-SAT's default probing and
    symmetry detection (what ``_fast_presolve`` turns off): (status name, objective seconds)."""
    from ortools.sat.python import cp_model

    from autoplan.sharding.ilp import _cpsat_model
    m, x, _ = _cpsat_model(problem)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.linearization_level = 2
    solver.parameters.add_lp_constraints_lazily = False
    status = solver.Solve(m)
    values = solver.response_proto.solution
    choice = tuple(next(s for s, v in enumerate(row) if values[v.index]) for row in x)
    return solver.StatusName(status), evaluate(problem, choice)


def test_fast_presolve_keeps_the_optimum_of_traced_blocks(gpt_block, llama_block, h100):
    """The solver settings change how CP-SAT searches, not what it finds: on real block ILPs
    (SP on and off, tp 2, 4 and 8, mbs 1 and 4) both reach the same optimal objective."""
    from autoplan.sharding.prepare import prepare
    from autoplan.sharding.solve import build_problem
    for graph in (gpt_block, llama_block):
        for tp, sp, mbs in ((2, True, 1), (4, False, 1), (8, False, 4), (8, True, 4)):
            ctx = h100(tp, sp, mbs=mbs)
            problem = build_problem(prepare(graph, ctx), ctx)
            ours = _solve_cpsat(problem, 30.0)
            status, reference = _cpsat_default_presolve(problem)
            assert ours.status == "optimal" and status == "OPTIMAL"
            assert ours.objective == pytest.approx(reference, rel=1e-9, abs=1e-12)
