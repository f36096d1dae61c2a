"""The audit of GPT-3 175B on h100x1024: a good hand plan against ``megascale``, and a bad one."""
from __future__ import annotations

import json

import pytest

from autoplan.baselines import baseline
from autoplan.explain import Side, audit, render_markdown
from autoplan.explain.units import AXIS_NAMES, KIND_NAMES
from autoplan.plan import Plan

GOOD = "tp=8,pp=8,vpp=2,schedule=zbv,recompute=selective,order=tp-cp-ep-pp-dp"
BAD = "tp=16,pp=4,vpp=2,schedule=interleaved,recompute=selective"      # TP over two 8-GPU nodes
BATCH = 1024


@pytest.fixture(scope="module")
def gpt3(setup):
    return setup("gpt3-175b", "h100x1024")


@pytest.fixture(scope="module")
def good_vs_megascale(gpt3):
    graph, cluster, estimator = gpt3
    plan = Plan.parse(GOOD, cluster.num_gpus)
    bplan = baseline("megascale", graph, cluster, seq=2048, global_batch=BATCH, estimator=estimator)
    return audit(graph, cluster, Side("plan", plan, estimator.estimate(plan, BATCH)),
                 Side("megascale", bplan, estimator.estimate(bplan, BATCH)))


def test_primitive_times_add_up_to_the_estimate(good_vs_megascale):
    a = good_vs_megascale
    for side in (a.plan, a.baseline):
        e = side.estimate
        assert side.comm_consistent()
        assert sum(p.time_s for p in e.primitives) == pytest.approx(e.comm_time_s, rel=1e-12)
        assert sum(p.exposed_s for p in e.primitives) == pytest.approx(e.comm_exposed_s, rel=1e-12)
        assert all(0 <= p.exposed_s <= p.time_s * (1 + 1e-12) for p in e.primitives)
    # the per-class differences are the same sums, class by class and in total
    assert sum(c.plan_time_s for c in a.classes) == pytest.approx(a.plan.estimate.comm_time_s)
    assert sum(c.base_time_s for c in a.classes) == pytest.approx(a.baseline.estimate.comm_time_s)
    assert sum(c.plan_exposed_s for c in a.classes) == pytest.approx(a.plan.estimate.comm_exposed_s)


def test_every_primitive_class_is_listed(good_vs_megascale):
    a = good_vs_megascale
    classes = {(p.kind, p.traffic) for s in (a.plan, a.baseline) for p in s.estimate.primitives}
    assert {(c.kind, c.traffic) for c in a.classes} == classes
    # GPT-3 with TP+SP, PP, DP (ZeRO-1) and a tied embedding uses all of these
    assert {("all_gather", "sp"), ("reduce_scatter", "sp"), ("p2p", "pp"), ("reduce_scatter", "dp"),
            ("all_gather", "dp"), ("all_reduce", "embed")} <= classes
    md = render_markdown(a)
    for kind, dim in classes:
        assert f"| {KIND_NAMES[kind]} | {AXIS_NAMES[dim]} |" in md
    assert "## Difference per primitive class (plan − megascale)" in md


def test_json_difference_matches_the_estimates(good_vs_megascale):
    a = good_vs_megascale
    d = json.loads(a.to_json())
    p, b = a.plan.estimate, a.baseline.estimate
    assert d["difference"]["step_time_s"] == pytest.approx(p.step_time_s - b.step_time_s, rel=1e-5)
    assert d["difference"]["mfu"] == pytest.approx(p.mfu - b.mfu, rel=1e-5)
    assert d["difference"]["memory_gib"] == pytest.approx(p.memory_gib - b.memory_gib, rel=1e-5)
    assert d["global_batch"] == BATCH and d["seq"] == 2048
    assert a.to_json() == a.to_json()                         # no set-order or float noise
    assert list(d) == sorted(d)


def test_good_plan_verdicts(good_vs_megascale):
    v = {x.rule: x for x in good_vs_megascale.verdicts}
    assert v["tp-inside-nvlink"].status == "pass"
    assert v["pp-p2p-span"].status == "info" and "IB" in v["pp-p2p-span"].text
    assert v["dp-outermost"].status == "pass"
    assert v["zero-bubble"].status == "pass"
    assert v["memory"].status == "pass"
    assert v["cp-long-context"].status == "pass"               # seq 2048, attention small
    base = {x.rule: x for x in good_vs_megascale.baseline_verdicts}
    assert base["zero-bubble"].status == "warn"                # interleaved 1F1B keeps a bubble


def test_bad_plan_fails_naming_group_and_link(gpt3):
    graph, cluster, estimator = gpt3
    plan = Plan.parse(BAD, cluster.num_gpus)
    a = audit(graph, cluster, Side("plan", plan, estimator.estimate(plan, BATCH)))
    v = {x.rule: x for x in a.verdicts}
    tp = v["tp-inside-nvlink"]
    assert tp.status == "fail"
    assert "TP group of 16 ranks (0…15) spans 2 NVLink domains over IB rail" in tp.text
    assert dict(tp.evidence)["time_s"] > 0
    # default order tp-cp-ep-dp-pp keeps dp inside pp, whose groups reach further out
    assert v["dp-outermost"].status == "warn"
    mfu = v["mfu-band"]
    assert mfu.status == "warn" and dict(mfu.evidence)["cause"] == "tp_comm"
    assert "exposed TP/SP communication" in mfu.text
    assert "❌ FAIL | `tp-inside-nvlink`" in render_markdown(a)
