"""experiments/fuzz_api.py: its invariants catch what they claim to, and a short run is clean."""
import copy
import json
import random

import pytest

SPEC = "llama:layers=4,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96"


@pytest.fixture(scope="module")
def fuzz(experiment):
    return experiment("fuzz_api")


def _estimate(fuzz, plan: str, cluster: str = "h100x16") -> dict:
    code, out, err, crash = fuzz.cli(["estimate", SPEC, "--cluster", cluster, "--seq", "128", "--global-batch",
                                      "16", "--plan", plan, "--json"])
    assert code == 0 and not crash, err
    return json.loads(out)


def test_a_sound_estimate_passes_and_doctored_ones_fail(fuzz):
    model = fuzz.Model(SPEC, layers=4, heads=6, kv_heads=6, experts=0)
    e = _estimate(fuzz, "tp=2,pp=2,dp=4")
    assert fuzz.estimate_problems(e, 16, 8, model, 16, 128) == []
    worse = copy.deepcopy(e)
    worse["time_breakdown_s"]["compute"] *= 1.1
    worse["primitives"][0]["exposed_s"] = worse["primitives"][0]["time_s"] * 2
    problems = fuzz.estimate_problems(worse, 16, 8, model, 16, 128)
    assert "breakdown does not add up to the step" in problems
    assert any(p.startswith("primitive ") and "exposed" in p for p in problems)
    assert "degrees do not multiply to the GPU count" in fuzz.estimate_problems(e, 32, 8, model, 16, 128)


def test_fits_is_judged_against_hbm_less_the_margin(fuzz):
    """Fuzz seed 880301, case 117: a peak of 76.3 GiB on an 80 GiB A100 with the 4 GiB margin does
    not fit, and the invariant once called that a disagreement (it compared with the whole HBM)."""
    model = fuzz.Model(SPEC, layers=4, heads=6, kv_heads=6, experts=0)
    e = _estimate(fuzz, "tp=2,pp=2,dp=4")
    between = dict(e, memory_gib=e["hbm_gib"] - e["memory_margin_gib"] / 2, fits=False)
    assert fuzz.estimate_problems(between, 16, 8, model, 16, 128) == []
    assert "fits disagrees with memory, HBM and margin" in fuzz.estimate_problems(
        dict(between, fits=True), 16, 8, model, 16, 128)


def test_a_tp_group_across_nvlink_must_be_flagged(fuzz):
    """tp=6 on 8-GPU domains: the second group (6…11) crosses; the answer must say so."""
    model = fuzz.Model(SPEC, layers=4, heads=6, kv_heads=6, experts=0)
    e = _estimate(fuzz, "tp=6,dp=4", cluster="h100x24")
    assert fuzz.estimate_problems(e, 24, 8, model, 16, 128) == []
    silent = dict(e, violations=[])
    assert any(p.startswith("tp groups crossing NVLink") for p in fuzz.estimate_problems(silent, 24, 8, model, 16, 128))


def test_axis_groups_follow_the_order(fuzz):
    p = {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2, "order": "tp-cp-ep-dp-pp"}
    assert sorted(fuzz.axis_groups(p, "tp")) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(fuzz.axis_groups(dict(p, order="pp-dp-ep-cp-tp"), "tp")) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(fuzz.axis_groups(p, "pp")) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_drawn_plans_multiply_to_the_gpus_and_cuts_hold_a_layer(fuzz):
    rng = random.Random(5)
    for _ in range(200):
        model = fuzz.draw_model(rng, 2048)
        plan, bad = fuzz.draw_plan(rng, 64, model, 2048)
        if not bad:
            assert plan["tp"] * plan["cp"] * plan["pp"] * plan["dp"] == 64
            if "layers" in plan:
                cuts = [int(x) for x in plan["layers"].split("-")]
                assert min(cuts) >= 1 and sum(cuts) == model.layers
