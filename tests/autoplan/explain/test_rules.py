"""Rule verdicts on long-context and MoE plans: SP/CP triggers, Ulysses and EP groups off NVLink."""
from __future__ import annotations

import pytest

from autoplan.explain.rules import largest_overhead, verdicts
from autoplan.plan import Plan

SEQ = 131072


def judged(setup, model, cluster, seq, text, batch):
    graph, c, estimator = setup(model, cluster, seq)
    plan = Plan.parse(text, c.num_gpus)
    est = estimator.estimate(plan, batch)
    return {v.rule: v for v in verdicts(graph, c, plan, est)}, est


@pytest.fixture(scope="module")
def long(setup):
    return lambda text: judged(setup, "llama3-8b", "h100x256", SEQ, text, 256)


def test_long_context_without_sp_and_cp_warns(long):
    v, est = long("tp=8,cp=1,recompute=full,sp=off")
    assert est.attention_time_share > 0.5
    assert v["sp-attention-share"].status == "warn" and "SP is off" in v["sp-attention-share"].text
    cp = v["cp-long-context"]
    assert cp.status == "warn" and "seq 131,072 ≥ 32K" in cp.text
    assert dict(cp.evidence)["seq"] == SEQ


def test_long_context_with_cp_passes(long):
    v, _ = long("tp=8,cp=16,recompute=selective")
    assert v["cp-long-context"].status == "pass" and "8,192 tokens per rank" in v["cp-long-context"].text
    assert v["sp-attention-share"].status == "pass"


def test_ulysses_across_nodes_fails(long):
    # (tp=8 with Ulysses over 16 is refused now: 4 heads per tp rank do not divide by 16)
    v, _ = long("tp=2,cp=16,cp_algo=ulysses,recompute=selective")
    u = v["cp-inside-nvlink"]
    assert u.status == "fail"
    assert "CP (Ulysses) group of 16 ranks (0, 2, …, 30) spans 4 NVLink domains over IB rail" in u.text


@pytest.mark.parametrize("order,status", [("tp-cp-dp-ep-pp", "fail"), ("tp-cp-ep-dp-pp", "pass")])
def test_ep_group_placement(setup, order, status):
    v, _ = judged(setup, "mixtral-8x22b", "h100x512", 2048, f"tp=1,pp=8,ep=8,order={order}", 512)
    ep = v["ep-inside-nvlink"]
    assert ep.status == status
    if status == "fail":
        assert "EP group of 8 ranks (0, 8, …, 56) spans 8 NVLink domains" in ep.text
    assert dict(ep.evidence)["calls_per_step"] > 0


def test_largest_overhead_counts_recompute(long):
    _, est = long("tp=8,cp=1,recompute=full,sp=off")
    key, seconds = largest_overhead(est)
    assert key == "recompute"
    compute = est.time_breakdown_s["compute"]
    assert seconds == pytest.approx(compute * (est.hfu - est.mfu) / est.hfu)
