"""Estimator: the step-time breakdown is taken on the busiest pipeline rank and adds up."""
import pytest

from autoplan.plan import Plan

MODEL = "gpt:layers=8,hidden=1024,heads=16,vocab=51200"


@pytest.mark.parametrize("layers", ["2-2-2-2", "1-1-1-5", "5-1-1-1"])
def test_breakdown_adds_up_to_the_step_on_uneven_stages(setup, layers):
    _, _, estimator = setup(MODEL, "h100x16")
    est = estimator.estimate(Plan.parse(f"tp=1,pp=4,dp=4,layers={layers},schedule=1f1b"), 64)
    parts = est.time_breakdown_s
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(est.step_time_s, rel=0.01)


@pytest.mark.parametrize("layers", ["2-2-2-2", "3-2-2-1"])
def test_bubble_is_at_most_the_1f1b_closed_form_on_the_busiest_rank(setup, layers):
    """The head (2·h·V FLOPs per token ≈ 4 layers here) makes the last rank the busiest even
    with fewer layers; its extra compute is imbalance, not bubble: bubble ≤ (p−1)/m · compute."""
    _, _, estimator = setup(MODEL, "h100x16")
    est = estimator.estimate(Plan.parse(f"tp=1,pp=4,dp=4,layers={layers},schedule=1f1b"), 64)
    m = 64 // 4
    parts = est.time_breakdown_s
    assert 0 < parts["pp_bubble"] <= (4 - 1) / m * parts["compute"]


def test_1f1b_with_fewer_microbatches_than_stages_prices_as_gpipe(setup):
    """m < pp: 1F1B's warm-up covers every micro-batch, so its order is GPipe's (Megatron, DeepSpeed)."""
    _, _, estimator = setup(MODEL, "h100x16")
    one_f = estimator.estimate(Plan.parse("tp=1,pp=4,dp=4,mbs=1,schedule=1f1b"), 8)
    gpipe = estimator.estimate(Plan.parse("tp=1,pp=4,dp=4,mbs=1,schedule=gpipe"), 8)
    assert one_f.microbatches == 2
    assert one_f.step_time_s == pytest.approx(gpipe.step_time_s, rel=1e-9)
    assert one_f.bubble_fraction > 0.5
