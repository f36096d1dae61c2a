"""experiments/regret_floor.py (issue 38): the least worst regret of any enumerated plan under a
scenario set, and the pinch that says why no plan meets the bound when none does."""

import pytest

SMALL = ("gpt:layers=4,hidden=512,heads=8,vocab=1000", "h100x16", 2048, 32)


def test_floor_finds_the_hedge_when_one_exists(experiment):
    floor = experiment("regret_floor").floor
    # fast wins on "slow-net" and loses 10 % on "slow-gemm", steady the reverse; hedge is 3 % off both
    steps = {"slow-net": {"fast": 1.00, "steady": 1.10, "hedge": 1.03},
             "slow-gemm": {"fast": 1.10, "steady": 1.00, "hedge": 1.03}}
    out = floor(steps, {}, "fast")
    assert out["minimax_plan"] == "hedge" and out["minimax_regret"] == pytest.approx(0.03) and out["ok"]
    assert out["pick_regret"] == pytest.approx(0.10)
    # a scenario's searched best below every enumerated plan raises every regret
    searched = floor(steps, {"slow-net": 0.95}, "fast")
    assert searched["minimax_plan"] == "hedge" and searched["minimax_regret"] == pytest.approx(1.03 / 0.95 - 1)
    assert not searched["ok"] and searched["pinch"]["plans"] == 0       # no plan within 5 % under slow-net


def test_floor_names_the_pinch_when_no_plan_meets_the_bound(experiment):
    floor = experiment("regret_floor").floor
    steps = {"slow-net": {"fast": 1.00, "steady": 1.12, "mid": 1.07},
             "slow-gemm": {"fast": 1.12, "steady": 1.00, "mid": 1.07}}
    out = floor(steps, {}, "fast")
    assert out["minimax_plan"] == "mid" and out["minimax_regret"] == pytest.approx(0.07) and not out["ok"]
    # under mid's worst scenario (slow-net, the tie broken by name) only fast is within 5 %, and it
    # loses 12 % under slow-gemm: the pinch
    assert out["pinch"]["plans"] == 1 and out["pinch"]["their_least_regret"] == pytest.approx(0.12)
    assert (out["minimax_scenario"], out["pinch"]["under"]) == ("slow-net", "slow-gemm")


@pytest.mark.slow        # one banded search and a few hundred plans × the scenarios
def test_small_case_floor_is_no_worse_than_the_pick(experiment):
    mod = experiment("regret_floor")
    row = mod.run_case(*SMALL, "own", {})          # 4 scenarios: the pricing is what costs
    assert row["plans"] > 1 and row["pick_regret"] is not None
    assert 0.0 <= row["minimax_regret"] <= row["pick_regret"]
    assert row["pinch"]["plans"] >= 1 and "| " + SMALL[0] in mod.markdown([row], "")
