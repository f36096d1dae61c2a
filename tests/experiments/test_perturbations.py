"""experiments/perturbations.py (issue 13): every objective picks from one banded search's pool, as
`search --objective` does; regret is measured against the perturbed model's own search; the
acceptance (worst regret ≤ 5 %, p50 within 3 % of the point-optimal plan's) is computed per case."""

import pytest

SMALL = ("gpt:layers=4,hidden=512,heads=8,vocab=1000", "h100x16", 2048, 32)


@pytest.fixture(scope="module")
def row(experiment):
    return experiment("perturbations").run_case(*SMALL)


@pytest.mark.slow        # ~6 searches, > 10 s on 2 cores; CI runs the slow tier too
def test_each_objective_picks_what_search_with_that_objective_returns(row, traced):
    import topologies
    from autoplan.search import SearchOptions, search

    graph, cluster = traced(SMALL[0], seq=SMALL[2]), topologies.load(SMALL[1])
    for objective in ("point", "regret"):
        first = search(graph, cluster, global_batch=SMALL[3], options=SearchOptions(objective=objective)).candidates[0]
        assert row["chosen"][objective]["plan"] == first.plan.to_string()
        assert row["chosen"][objective]["p50_s"] == first.band.step(0.5)


@pytest.mark.slow
def test_regret_is_against_the_perturbed_models_own_best(row, experiment):
    pert = experiment("perturbations")
    assert set(row["perturbed"]) == set(pert.PERTURBATIONS)
    for p in row["perturbed"].values():
        assert all(r >= -1e-9 for r in p["regret"].values())       # the perturbed search's best is the best
        assert p["outside_ranges"] == [] and isinstance(p["best_in_pool"], bool)   # the multipliers are sampled
    a = row["acceptance"]
    assert a["objective"] == "regret"
    assert a["worst_regret"] == max(p["regret"]["regret"] for p in row["perturbed"].values())
    assert a["ok"] == (a["worst_regret"] <= 0.05 and a["p50_over_point_p50"] <= 1.03)
    text = pert.markdown([row], "")
    assert "Acceptance met in" in text and row["chosen"]["regret"]["plan"] in text


def test_outside_ranges_names_multipliers_the_bands_never_sample(experiment):
    from autoplan.cost.params import Params
    pert = experiment("perturbations")
    assert pert.outside_ranges(Params(nic_efficiency=0.8, wpass=1.2), "h100") == []
    assert pert.outside_ranges(Params(nic_efficiency=0.5, wpass=1.3), "h100") == ["nic_efficiency=0.5", "wpass=1.3"]


def test_acceptance_fails_past_either_bound(experiment):
    pert = experiment("perturbations")
    base = {"chosen": {"point": {"p50_s": 1.0}, "regret": {"p50_s": 1.02}},
            "perturbed": {"nic": {"regret": {"regret": 0.04}}, "all": {"regret": {"regret": 0.049}}}}
    assert pert.acceptance(base)["ok"]
    base["perturbed"]["all"]["regret"]["regret"] = 0.051
    assert not pert.acceptance(base)["ok"]
    base["perturbed"]["all"]["regret"]["regret"] = 0.0
    base["chosen"]["regret"]["p50_s"] = 1.031
    assert not pert.acceptance(base)["ok"]


def test_the_scenario_set_moves_each_parameter_alone_and_then_together(experiment):
    from dataclasses import asdict

    from autoplan.cost.params import NOMINAL, PARAM_NAMES

    p = experiment("perturbations")
    scenarios = p.scenarios()
    assert len(scenarios) == 2 * len(p.SCENARIO_PARAMETERS) + len(p.COMBINED)
    assert sorted(p.SCENARIO_PARAMETERS + tuple(p.LEFT_OUT)) == sorted(PARAM_NAMES)    # every one, or why not
    for name in p.SCENARIO_PARAMETERS:
        for m in (0.8, 1.2):
            moved = {k: v for k, v in asdict(scenarios[f"{name}×{m:g}"]).items() if v != asdict(NOMINAL)[k]}
            assert moved == {name: m}
    slow = asdict(scenarios["slow-network"])
    wire = {"nic_efficiency", "nvlink_efficiency", "dp_overlap", "cp_overlap"}
    assert {k for k, v in slow.items() if v != 1.0} == wire


def test_the_own_scenario_set_moves_compute_and_wire_in_opposite_directions(experiment):
    from dataclasses import asdict

    p = experiment("perturbations")
    own = p.scenarios("own")
    assert set(own) == set(p.OWN) and set(p.scenarios("all")) == set(p.scenarios()) | set(own)
    bound, comm = asdict(own["compute-bound"]), asdict(own["comm-bound"])
    assert bound["gemm_peak"] < 1.0 < bound["nic_efficiency"] and comm["nic_efficiency"] < 1.0 < comm["gemm_peak"]
    assert all(0.8 <= v <= 1.2 for s in own.values() for v in asdict(s).values())


def test_partial_op_asks_every_search_for_op_n(experiment):
    from autoplan.plan import RECOMPUTE
    from autoplan.search.space import PARTIAL_OP, Constraints
    pert = experiment("perturbations")
    assert pert.constraints(False) == Constraints()
    assert pert.constraints(True).recompute == RECOMPUTE + (PARTIAL_OP,)
