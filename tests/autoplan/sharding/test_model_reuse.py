"""What the block ILP reuses across contexts: the CP-SAT model's variables and constraints per
problem structure (``ilp._skeleton``) and the tensors' placements and readers per prepared graph
(``solve._tensor_shapes``).  A reused piece must give the model, the problem and the solution
that building everything afresh gives."""
from __future__ import annotations

import pytest

from autoplan.sharding import ilp
from autoplan.sharding import solve as solve_mod
from autoplan.sharding.prepare import prepare
from autoplan.sharding.solve import build_problem

# one tp sub-mesh at several micro-batch and cp sizes (they share a structure where the local dims
# divide alike), SP off, and the NVLink rule on (forbidden redistributions)
CONTEXTS = [dict(tp=4, sp=True, mbs=1), dict(tp=4, sp=True, mbs=2), dict(tp=4, sp=True, mbs=4, cp=2),
            dict(tp=4, sp=True, mbs=1, cp=2), dict(tp=4, sp=False, mbs=2),
            dict(tp=8, sp=True, mbs=1, forbid_tp_collectives=True), dict(tp=8, sp=True, mbs=2)]


def _fresh_text_model(problem: ilp.IlpProblem):
    """The model as ``_cpsat_model`` wrote it before skeletons: the whole proto as text, parsed once."""
    from ortools.sat.python import cp_model

    text = ilp._TextModel()
    x, objective = ilp._build(problem, text)
    hint = ilp._greedy_choice(problem)
    m = cp_model.CpModel()
    m.proto.parse_text_format(text.proto(objective, [(v, s == b) for b, row in zip(hint, x)
                                                     for s, v in enumerate(row)]))
    return m, x


@pytest.fixture
def problems(gpt_block, llama_block, h100):
    """Every (block, context) problem, built with the shapes memo in use."""
    solve_mod._TENSOR_SHAPES.clear()
    out = []
    for graph in (gpt_block, llama_block):
        for kw in CONTEXTS:
            ctx = h100(**kw)
            out.append((graph, ctx, build_problem(prepare(graph, ctx), ctx)))
    return out


def test_memoised_tensor_shapes_build_the_fresh_problem(problems):
    """Each context's problem equals the one built with an empty memo; the memo served more than
    one context (the micro-batch variants of one tp sub-mesh share a prepared graph)."""
    assert len(solve_mod._TENSOR_SHAPES) < len(problems)
    for graph, ctx, problem in problems:
        solve_mod._TENSOR_SHAPES.clear()
        assert build_problem(prepare(graph, ctx), ctx) == problem
    forbidden = [p for _, ctx, p in problems if ctx.forbid_tp_collectives]
    assert forbidden and all(any(t.forbidden_redist for t in p.tensors) for p in forbidden)


def test_a_reused_skeleton_is_the_fresh_model_proto_for_proto(problems):
    """Problems of one structure with other costs: the model from the shared skeleton (objective
    and hints merged in) is the whole-text model, variable for variable; the skeleton was shared."""
    ilp._SKELETONS.clear()
    for _, _, problem in problems:
        m, x, _ = ilp._cpsat_model(problem)
        ref, ref_x = _fresh_text_model(problem)
        assert str(m.proto) == str(ref.proto)
        assert [list(row) for row in x] == [list(row) for row in ref_x]
    assert len(ilp._SKELETONS) < len(problems)
    costs = {p.nodes[0].cost for _, _, p in problems}
    assert len(costs) > len(ilp._SKELETONS)          # a skeleton served problems of different costs


def test_a_reused_skeleton_solves_as_a_fresh_one(problems):
    """The same strategies and objective whether every solve builds its model afresh or the
    problems share skeletons (CP-SAT: one worker, fixed seed, so one model gives one answer).
    The NVLink rule forbids every tp collective here, which leaves the problems no solution."""
    ilp._SKELETONS.clear()
    solvable = [p for _, ctx, p in problems if not ctx.forbid_tp_collectives]
    shared = [ilp.solve(p) for p in solvable]
    assert len(ilp._SKELETONS) < len(solvable)
    for p, sol in zip(solvable, shared):
        ilp._SKELETONS.clear()
        fresh = ilp.solve(p)
        assert (fresh.choice, fresh.objective, fresh.status) == (sol.choice, sol.objective, sol.status)


@pytest.mark.parametrize("block", ["gpt_block", "llama_block"])
def test_prices_of_one_policy_price_every_policy(block, h100, request):
    """``price_assignment`` given the layout's prices at recompute ``none`` equals the one that
    prices everything at the policy itself, for every policy (full and op rerun forward
    redistributions, selective and op rerun ops), at two micro-batch and cp sizes."""
    from dataclasses import replace

    from autoplan.sharding import price_assignment, solve_assignment
    from autoplan.sharding.solve import layout_prices

    graph = request.getfixturevalue(block)
    for kw in (dict(tp=4, sp=True, mbs=2), dict(tp=8, sp=False, mbs=1, cp=2)):
        ctx = h100(**kw)
        a = solve_assignment(graph, ctx)
        prices = layout_prices(graph, a, ctx)
        reran = 0
        for policy in ("none", "selective", "op", "full"):
            at = replace(ctx, recompute=policy)
            shared = price_assignment(graph, a, at, prices)
            assert shared == price_assignment(graph, a, at)
            reran += sum("[recompute]" in c.tensor for c in shared.collectives)
        assert reran > 0
