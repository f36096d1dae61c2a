"""``SearchOptions.constraints``: the best plan under fixed knobs (what ``autoplan study`` asks).

The constrained space is the unconstrained one filtered, mesh by mesh; the constrained search
returns only plans that obey it, never beats the free search, and finds the free optimum again
when that optimum already obeys the constraints."""
import dataclasses

import pytest

from autoplan.errors import UserError
from autoplan.search import Constraints, SearchOptions, search
from autoplan.search.space import enumerate_meshes

MODEL = "llama:layers=16,hidden=2048,heads=16,kv_heads=8,ffn=8192,vocab=32000"
SEQ, CLUSTER, BATCH = 32768, "h100x32", 32
FAST = dict(samples=0, objective="point", workers=1, top_k=2)


@pytest.fixture(scope="module")
def long_context(setup):
    graph, cluster, _ = setup(MODEL, CLUSTER, seq=SEQ)
    return graph, cluster


def _meshes(graph, cluster, constraints=Constraints()):
    meshes, _ = enumerate_meshes(graph.model, graph.num_layers, cluster, seq=graph.seq_len, global_batch=BATCH,
                                 constraints=constraints)
    return meshes


@pytest.mark.parametrize("constraints", [
    Constraints(cp=(2, 4, 8), cp_algos=("ulysses",)), Constraints(sp=(False,)), Constraints(sp=(True,)),
    Constraints(tp=(1,), pp=(1,), cp=(1,)), Constraints(dp=(4,), cp_algos=("ring", "usp"))], ids=str)
def test_the_constrained_space_is_the_free_space_filtered(long_context, constraints):
    graph, cluster = long_context
    free = _meshes(graph, cluster)
    kept = [m for m in free if constraints.allows_degrees(m.tp, m.cp, m.pp, m.dp)
            and constraints.allows_algo(m.cp, m.cp_algo) and constraints.allows_sp(m.tp, m.sp)]
    assert _meshes(graph, cluster, constraints) == kept
    assert 0 < len(kept) < len(free)


def test_ulysses_only_is_refused_where_the_heads_do_not_divide(long_context):
    graph, cluster = long_context          # 16 heads: tp·cp = 32 cannot give every Ulysses rank a head
    meshes = _meshes(graph, cluster, Constraints(cp=(2, 4, 8, 16, 32), cp_algos=("ulysses",)))
    assert meshes and all((16 // m.tp) % m.cp == 0 for m in meshes)
    assert not any(m.cp == 32 for m in meshes)


@pytest.mark.parametrize("constraints", [
    Constraints(cp=(2, 4, 8, 16), cp_algos=("ulysses",)), Constraints(sp=(False,), cp=(1,)),
    Constraints(recompute=("full",)), Constraints(tp=(1,), pp=(1,), cp=(1,))], ids=str)
def test_a_constrained_search_obeys_and_never_beats_the_free_one(long_context, constraints):
    graph, cluster = long_context
    free = search(graph, cluster, global_batch=BATCH, options=SearchOptions(**FAST)).candidates[0]
    bound = search(graph, cluster, global_batch=BATCH, options=SearchOptions(**FAST, constraints=constraints))
    for c in bound.candidates:
        p = c.plan
        assert constraints.allows_degrees(p.tp, p.cp, p.pp, p.dp), p.to_string()
        assert constraints.allows_algo(p.cp, p.cp_algo) and constraints.allows_sp(p.tp, p.sp), p.to_string()
        assert set(p.recompute) <= set(constraints.recompute), p.to_string()
        assert c.estimate.fits
    assert bound.candidates[0].estimate.step_time_s >= free.estimate.step_time_s * (1 - 1e-9)


def test_the_free_optimum_is_found_again_when_it_obeys(long_context):
    graph, cluster = long_context
    free = search(graph, cluster, global_batch=BATCH, options=SearchOptions(**FAST)).candidates[0].plan
    same = Constraints(tp=(free.tp,), cp=(free.cp,), pp=(free.pp,), cp_algos=(free.cp_algo,), sp=(free.sp,))
    again = search(graph, cluster, global_batch=BATCH, options=SearchOptions(**FAST, constraints=same))
    assert again.candidates[0].plan == free


def test_no_plan_under_the_constraints_names_them(setup):
    graph, cluster, _ = setup("gpt-1.7b", "h100x8", seq=2048)
    options = SearchOptions(**FAST, constraints=Constraints(tp=(3,)))
    with pytest.raises(UserError, match=r"under the constraints \(tp ∈ \{3\}\)") as err:
        search(graph, cluster, global_batch=8, options=options)
    assert "loosen the constraints" in err.value.fix


@pytest.mark.parametrize("field,value,problem", [("cp_algos", ("ring", "tree"), "unknown 'tree'"),
                                                 ("recompute", (), "empty"), ("tp", (0,), "whole number"),
                                                 ("sp", (), "True/False")])
def test_a_bad_constraint_is_a_user_error(field, value, problem):
    with pytest.raises(UserError, match=problem) as err:
        Constraints(**{field: value})
    assert err.value.fix


def test_recompute_policies_are_kept_weakest_first():
    assert Constraints(recompute=("full", "none")).recompute == ("none", "full")
    assert Constraints().any and not Constraints(sp=(False,)).any
    assert dataclasses.replace(Constraints(), cp_algos=("usp",)).describe() == "cp_algo ∈ {usp}"
