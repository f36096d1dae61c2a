"""The block ILP's solve memo (``sharding.solve.solve_problem``): keyed by the problem itself, so
contexts that build the same problem share one solve and contexts that build different ones
do not — and a shared solve is the solve it replaces."""
from __future__ import annotations

import pytest

from autoplan.frontend import trace
from autoplan.sharding import ilp, solve as solve_mod
from autoplan.sharding.prepare import prepare
from autoplan.sharding.solve import build_problem, solve_assignment


@pytest.fixture(scope="module")
def gpt():
    return trace("gpt:layers=2,hidden=2048,heads=16,vocab=51200", seq=2048)


@pytest.fixture
def solves(monkeypatch):
    """Counts the ILP solves actually run, from an empty memo."""
    calls = []
    real = ilp.solve

    def counting(problem, backend="cpsat", time_limit_s=30.0):
        calls.append(problem)
        return real(problem, backend, time_limit_s)
    monkeypatch.setattr(solve_mod, "_SOLVED", {})
    monkeypatch.setattr(ilp, "solve", counting)
    return calls


def test_tokens_per_gpu_alone_reach_a_head_without_attention(gpt, h100, solves):
    """The head (@post) prices mbs / cp tokens: (mbs 2, cp 2) builds (mbs 1, cp 1)'s problem and
    takes its solution without a second solve; the same choice as solving it afresh."""
    one, two = h100(4, True, mbs=1, cp=1), h100(4, True, mbs=2, cp=2)
    assert build_problem(prepare(gpt.post, one), one) == build_problem(prepare(gpt.post, two), two)
    a = solve_assignment(gpt.post, one)
    b = solve_assignment(gpt.post, two)
    assert len(solves) == 1
    assert {k: s.name for k, s in a.choice.items()} == {k: s.name for k, s in b.choice.items()}
    solve_mod._SOLVED.clear()
    fresh = solve_assignment(gpt.post, two)
    assert len(solves) == 2 and fresh.choice == b.choice and fresh.objective_s == b.objective_s


def test_what_the_problem_depends_on_is_not_shared(gpt, h100, solves):
    """Attention sees the whole sequence: at cp 2 its problem differs from mbs 1's even at
    equal tokens per GPU, and so do a larger micro-batch, another tp, SP and a solver setting."""
    block = gpt.blocks[0].graph
    ctxs = [h100(4, True, mbs=1, cp=1), h100(4, True, mbs=2, cp=2), h100(4, True, mbs=4, cp=1),
            h100(2, True, mbs=1, cp=1), h100(4, False, mbs=1, cp=1), h100(4, True, mbs=1, cp=1, time_limit_s=5.0)]
    for ctx in ctxs:
        solve_assignment(block, ctx)
    assert len(solves) == len(ctxs)
    solve_assignment(block, h100(4, True, mbs=1, cp=1))        # the first again: remembered
    assert len(solves) == len(ctxs)
