"""The block ILP's solve memo (``sharding.solve.solve_problem``): keyed by the problem itself, so
contexts that build the same problem share one solve and contexts that build different ones
do not — and a shared solve is the solve it replaces."""
from __future__ import annotations

import pytest

from autoplan.frontend import trace
from autoplan.sharding import ilp
from autoplan.sharding import solve as solve_mod
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
    solve_mod.solve_problem.cache_clear()
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
    solve_mod.solve_problem.cache_clear()
    fresh = solve_assignment(gpt.post, two)
    assert len(solves) == 2 and fresh.choice == b.choice and fresh.objective_s == b.objective_s


def test_what_the_problem_depends_on_is_not_shared(gpt, h100, solves):
    """Half the tokens per GPU at cp 2, a larger micro-batch, another tp, SP and a solver setting
    each make another problem; the first context again is remembered, and so is cp 2 at twice
    the micro-batch: the same tokens per GPU, and the causal attention work of a rank's two
    balanced chunks does not depend on cp (``cost/cp.py``), so the same costs."""
    block = gpt.blocks[0].graph
    ctxs = [h100(4, True, mbs=1, cp=1), h100(4, True, mbs=1, cp=2), h100(4, True, mbs=4, cp=1),
            h100(2, True, mbs=1, cp=1), h100(4, False, mbs=1, cp=1), h100(4, True, mbs=1, cp=1, time_limit_s=5.0)]
    for ctx in ctxs:
        solve_assignment(block, ctx)
    assert len(solves) == len(ctxs)
    solve_assignment(block, h100(4, True, mbs=1, cp=1))        # the first again: remembered
    solve_assignment(block, h100(4, True, mbs=2, cp=2))        # the same problem as the first
    assert len(solves) == len(ctxs)


def _structure(prep):
    return (repr([(u.leader, u.members, u.strategies) for u in prep.units]), repr(prep.unit_of), repr(prep.alias),
            repr(sorted(prep.reads.items(), key=lambda kv: (kv[0].node, kv[0].index))))


@pytest.mark.parametrize("block", ["gpt_block", "llama_block"])
def test_prepare_memo_is_the_fresh_preparation_in_every_context(block, h100, request):
    """``prepare`` remembers a block's units and reads on tp, sp and which scaled dims divide:
    over micro-batches 1–8 and cp 1–16 (tp 2, 8; SP on and off) every remembered preparation is
    the one preparing afresh gives, and the contexts meet on far fewer preparations than there
    are contexts (mbs 16 with cp 16 on a 4096 sequence: the same divisibility as mbs 1, cp 1)."""
    from autoplan.sharding import prepare as prepare_mod
    graph = request.getfixturevalue(block)
    prepare_mod._PREPARED.clear()
    contexts = [h100(tp, sp, mbs=mbs, cp=cp) for tp in (2, 8) for sp in (True, False)
                for mbs in (1, 2, 4, 8) for cp in (1, 2, 4, 16)]
    for ctx in contexts:
        assert _structure(prepare(graph, ctx)) == _structure(prepare_mod._prepare(graph, ctx))
    assert 4 <= len(prepare_mod._PREPARED) < len(contexts) // 4
