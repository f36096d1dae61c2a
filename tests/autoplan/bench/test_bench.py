"""The harness's pieces: suite selection, the Megatron grid, ratios, the report and the cache."""
from __future__ import annotations

import json
import time

import pytest

from autoplan.bench import SUITES, select
from autoplan.bench.case import SearchTimeout, _ratios, _time_limit
from autoplan.bench.grid import grid_plans, search_grid, tp_degrees
from autoplan.bench.report import answer, compact_plan, markdown, write_section
from autoplan.bench.runner import load_cached
from autoplan.bench.suite import Case
from autoplan.errors import UserError
from topologies import load


# --- suite -----------------------------------------------------------------------------------------

def test_default_suite_covers_the_issue():
    cases = {c.name: c for c in SUITES["default"]}
    assert len(cases) == 12
    got = {(c.model, c.cluster, c.seq) for c in cases.values()}
    for want in [("gpt3-175b", "h100x1024", 2048), ("llama3-70b", "h100x1024", 8192),
                 ("llama3-405b", "h100x8192", 8192), ("llama3-405b", "h100x16384", 8192),
                 ("mixtral-8x22b", "h100x512", 4096), ("deepseek-v3", "h100x2048", 4096),
                 ("llama3-8b", "h100x256", 32768), ("llama3-8b", "h100x256", 131072),
                 ("llama3-70b", "h100x1024", 131072), ("llama3-405b", "gb200x2304", 8192),
                 ("deepseek-v3", "gb200x2304", 4096), ("gpt-1t", "a100x3072", 2048)]:
        assert want in got, want
    for c in cases.values():
        n = load(c.cluster).num_gpus
        assert c.why and c.global_batch >= 1
        if n % 9 == 0:          # NVL72: a multiple of the GPU count, every dp degree divides it
            assert c.global_batch % n == 0
    assert cases["llama3-405b-h100x8192"].tokens_per_step == 2048 * 8192


def test_select_by_name_keeps_suite_order_and_rejects_unknown():
    names = [c.name for c in SUITES["quick"]]
    assert [c.name for c in select("quick", [names[2], names[0]])] == [names[0], names[2]]
    with pytest.raises(UserError, match="unknown case 'nope'"):
        select("quick", ["nope"])
    with pytest.raises(UserError, match="unknown suite"):
        select("huge")


# --- grid ------------------------------------------------------------------------------------------

def test_tp_degrees_stay_inside_nvlink_and_divide_heads():
    assert tp_degrees(96, 96, load("h100x1024")) == [1, 2, 4, 8]
    assert tp_degrees(96, 96, load("gb200x2304")) == [1, 2, 3, 4, 6, 8, 12, 24]     # 72-GPU domain, 96 heads
    assert tp_degrees(128, 8, load("gb200x2304")) == [1, 2, 4, 8]                   # GQA: 8 KV heads
    assert tp_degrees(48, 8, load("h100x512")) == [1, 2, 4, 8]


@pytest.fixture(scope="module")
def small():
    """A GPT-1.7B on 64 H100 (24 layers, 24 heads) and its Estimator."""
    from autoplan.commands.baseline import prepare

    return prepare("gpt-1.7b", "h100x64", 2048, 1)


def test_grid_plans_follow_megatron_rules(small):
    graph, cluster, est = small
    plans = list(grid_plans(est, 256, (1,)))
    assert len(plans) == len({p.to_string() for p in plans}) > 100
    for p in plans:
        assert p.num_gpus == 64 and p.tp in (1, 2, 4, 8) and p.cp == 1 and p.ep == 1
        assert p.sp == (p.tp > 1) and p.zero == (1 if p.dp > 1 else 0) and p.order == ("tp", "cp", "ep", "dp", "pp")
        assert 256 % (p.dp * p.mbs) == 0 and p.mbs in (1, 2, 4, 8)
        if p.vpp > 1:
            assert p.schedule == "interleaved" and 24 % (p.pp * p.vpp) == 0
        else:
            assert p.schedule == "1f1b"
    assert {p.recompute[0] for p in plans} == {"none", "selective", "full"}
    assert any(p.pp == 8 and p.vpp == 3 for p in plans)      # 24 layers = 8 stages × 3 chunks


def test_search_grid_returns_the_fastest_fitting_plan(small):
    graph, cluster, est = small
    result = search_grid(est, 256)
    assert result.best is not None and result.fitting <= result.valid <= result.plans
    best = est.estimate(result.best, 256).step_time_s
    for plan in list(grid_plans(est, 256, (1,)))[::7]:
        try:
            e = est.estimate(plan, 256, detail=False)
        except UserError:
            continue
        if e.fits:
            assert e.step_time_s >= best - 1e-12


# --- ratios ----------------------------------------------------------------------------------------

def _row(name, tps, *, fits=True, nvlink=True, status="ok"):
    return {"contender": name, "status": status, "tokens_per_s": tps if status == "ok" else None,
            "fits": fits, "respects_nvlink": nvlink}


def test_ratios_use_the_fastest_rule_respecting_recipe_that_fits():
    rows = {"auto": _row("auto", 120.0), "grid": _row("grid", 100.0),
            "megatron": _row("megatron", 110.0, nvlink=False), "megascale": _row("megascale", 80.0),
            "llama3": _row("llama3", 200.0, fits=False), "fsdp": _row("fsdp", 60.0),
            "deepseek": _row("deepseek", None, status="n/a")}
    r = _ratios(rows)
    assert r["best_hand"] == "megascale" and r["auto_vs_hand"] == pytest.approx(1.5)
    assert r["best_hand_any"] == "megatron" and r["auto_vs_hand_any"] == pytest.approx(120 / 110)
    assert r["auto_vs_grid"] == pytest.approx(1.2)
    rows["auto"] = _row("auto", None, status="error")
    assert _ratios(rows)["auto_vs_hand"] is None


# --- report ----------------------------------------------------------------------------------------

def _record(name, params, gpus, vs_hand, vs_grid, status="ok"):
    return {"case": {"name": name, "group": "dense", "model": name, "cluster": f"h100x{gpus}", "seq": 2048,
                     "global_batch": 1024, "why": "test", "grid_cp": [1]},
            "status": status, "error": None if status == "ok" else "boom", "params": params, "gpus": gpus,
            "auto_vs_hand": vs_hand, "auto_vs_grid": vs_grid, "contenders": []}


def test_answer_counts_only_big_models_on_big_clusters():
    records = [_record("a", 175e9, 1024, 1.20, 1.05), _record("b", 405e9, 8192, 0.93, 0.91),
               _record("small", 8e9, 256, 0.50, 0.50), _record("few-gpus", 141e9, 512, 0.40, 0.40)]
    text = answer(records)
    assert "in the 2 cases" in text and "0.93–1.20×" in text and "95 % in 1 of 2" in text and "90 % in 2" in text
    assert text.split("**")[2].strip().startswith("Mostly")
    assert "0.91–1.05×" in text
    yes = answer([_record("a", 175e9, 1024, 1.20, 1.05), _record("b", 405e9, 8192, 1.01, 0.99)])
    assert "Yes, and beyond it" in yes
    none = answer([_record("x", 671e9, 2048, None, None, status="error")])
    assert "Not answered" in none and "failed: x" in none


def test_compact_plan():
    plan = ("tp=8,pp=16,dp=64,cp=1,ep=1,vpp=2,mbs=1,schedule=interleaved,recompute=selective,sp=on,zero=1,"
            "cp_algo=ring,order=tp-cp-ep-pp-dp")
    assert compact_plan(plan) == "tp8·pp16·dp64 zero1 mbs1 interleaved×2 rc selective sp dp-outer"


def test_write_section_replaces_only_its_own_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n<!-- other:start -->\nx\n<!-- other:end -->\n")
    write_section(str(path), "first")
    write_section(str(path), "second")
    text = path.read_text()
    assert text == ("# Results\n\n<!-- other:start -->\nx\n<!-- other:end -->\n\n"
                    "<!-- bench:start -->\nsecond\n<!-- bench:end -->\n")


def test_markdown_marks_failures_and_links_plots():
    failed = _record("broken", 1e9, 8, None, None, status="error")
    failed["contenders"] = []
    md = markdown([failed], command="autoplan bench", plots={"MFU per case": "bench/mfu.png"})
    assert "| broken | 8 |" in md and "**failed**: boom" in md and "![MFU per case](bench/mfu.png)" in md


# --- cache and time limit --------------------------------------------------------------------------

def test_cache_is_reused_only_for_the_same_case_definition(tmp_path):
    case = Case("c", "quick", "gpt-1.7b", "h100x64", 2048, 256, "test")
    path = tmp_path / "c.json"
    assert load_cached(str(path), case) is None
    path.write_text(json.dumps({"case": case.to_dict(), "status": "ok"}))
    assert load_cached(str(path), case)["status"] == "ok"
    changed = Case("c", "quick", "gpt-1.7b", "h100x64", 2048, 512, "test")
    assert load_cached(str(path), changed) is None
    path.write_text("{not json")
    assert load_cached(str(path), case) is None


def test_time_limit_interrupts():
    start = time.perf_counter()
    with pytest.raises(SearchTimeout, match="0.2 s limit"):
        with _time_limit(0.2):
            while True:
                time.sleep(0.01)
    assert time.perf_counter() - start < 2
    with _time_limit(0):          # no limit
        time.sleep(0.01)
