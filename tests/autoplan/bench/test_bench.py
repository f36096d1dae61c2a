"""The harness's pieces: suite selection, the Megatron grid, ratios, the report and the cache."""
from __future__ import annotations

import json
import time

import pytest

from autoplan.bench import SUITES, select
from autoplan.bench.case import _ratios
from autoplan.bench.grid import grid_plans, search_grid, tp_degrees
from autoplan.bench.report import answer, compact_plan, margin_verdict, markdown
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
    from autoplan.workload import Workload

    w = Workload.load("gpt-1.7b", "h100x64", seq=2048, global_batch=1)
    return w.model, w.cluster, w.estimator()


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
            "deepseek": _row("deepseek", None, status="n/a"), "published": _row("published", None, status="n/a")}
    r = _ratios(rows)
    assert r["best_hand"] == "megascale" and r["auto_vs_hand"] == pytest.approx(1.5)
    assert r["best_hand_any"] == "megatron" and r["auto_vs_hand_any"] == pytest.approx(120 / 110)
    assert r["auto_vs_grid"] == pytest.approx(1.2)
    rows["fsdp"] = dict(_row("fsdp", 1000.0), credible=False)        # fast, but not written for this family
    assert _ratios(rows)["best_hand"] == "megascale"
    rows["auto"] = _row("auto", None, status="error")
    assert _ratios(rows)["auto_vs_hand"] is None


def test_a_published_layout_that_ran_is_the_hand_baseline_even_above_hbm():
    """Issue 36: the memory model's miss does not demote a run that happened to a slower recipe."""
    rows = {"auto": _row("auto", 120.0), "grid": _row("grid", 100.0), "megatron": _row("megatron", 60.0),
            "megascale": _row("megascale", 80.0), "llama3": _row("llama3", 200.0, fits=False),
            "fsdp": _row("fsdp", None, status="n/a"), "deepseek": _row("deepseek", None, status="n/a"),
            "published": dict(_row("published", 100.0, fits=False), memory_model_miss=True)}
    r = _ratios(rows)
    assert r["best_hand"] == "published" and r["auto_vs_hand"] == pytest.approx(1.2)
    assert r["best_hand_fits"] == "megascale" and r["auto_vs_hand_fits"] == pytest.approx(1.5)
    rows["published"]["memory_model_miss"] = False               # a recipe above HBM still does not count
    assert _ratios(rows)["best_hand"] == "megascale"


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
    assert "in the 2 cases with ≥ 100B parameters on more than 1,000 GPUs (a, b)" in text
    assert "0.93–1.20× (median 1.06×)" in text and "95 % of it in 1 of 2" in text and "90 % in 2" in text
    assert text.split("**")[2].strip().startswith("Mostly")
    assert "0.91–1.05× (median 0.98×), lowest b" in text and "small" not in text
    yes = answer([_record("a", 175e9, 1024, 1.20, 1.05), _record("b", 405e9, 8192, 1.01, 0.99)])
    assert "Yes, and beyond it" in yes
    none = answer([_record("x", 671e9, 2048, None, None, status="error")])
    assert "Not answered" in none and "failed: x" in none


def _banded(name, vs_hand, p10, evidence):
    r = _record(name, 175e9, 1024, vs_hand, 1.0)
    r.update(auto_vs_hand_p10=p10, auto_vs_hand_p50=vs_hand, auto_vs_hand_p90=vs_hand + 0.05, p_auto_beats_hand=0.75,
             auto_evidence=evidence, profile_residuals={"low": -0.063, "high": 0.017, "source": "public rows"})
    return r


def test_answer_says_which_margins_are_inside_the_noise():
    records = [_banded("parity", 1.10, 0.98, []), _banded("small", 1.05, 1.02, []),
               _banded("leaning", 1.30, 1.20, ["schedule", "cp", "mfu"]), _banded("clean", 1.30, 1.20, ["mfu"])]
    assert margin_verdict(records[0]) == (True, "inside the noise: the band reaches parity (p10 ≤ 1)")
    assert margin_verdict(records[1]) == (True, "inside the noise: the margin (5.0%) is within the profile's "
                                                "residual (6.3%)")
    inside, why = margin_verdict(records[2])
    assert not inside and "rests on schedule, cp," in why and "mfu" not in why
    assert margin_verdict(records[3]) == (False, "outside the band and the residual (6.3%)")
    text = answer(records)
    assert "In 2 of 4 cases the whole p10–p90 band" in text
    assert ("the other 2 are inside the noise; but in 1 of the 2 the margin rests on regimes no timed published "
            "run covers") in text
    assert ("- small: auto/hand 1.05× (p10–p90 1.02–1.10×, auto faster in 75% of the samples); GEMM-rate range "
            "sampled (public-row residuals, out of sample) -6.3% … +1.7%; unvalidated regimes of the auto plan: none "
            "— inside the noise") in text
    assert "unvalidated regimes of the auto plan: schedule, cp, mfu — outside the band" in text


def test_a_margin_within_the_out_of_sample_error_of_its_regimes_is_noise():
    r = _banded("cp-leaning", 1.10, 1.05, ["cp"])
    r["auto_out_of_sample"] = {"megatron": 0.066, "cp": 0.139}
    assert margin_verdict(r) == (True, "inside the noise: the margin (10.0%) is within the out-of-sample error "
                                       "of cp (13.9%)")
    assert "out-of-sample error of the regimes it is priced like: megatron 6.6%, cp 13.9%; " in answer([r])
    r["auto_out_of_sample"] = {"megatron": 0.066}
    assert not margin_verdict(r)[0]


def test_band_against_the_fastest_credible_recipe_when_none_respects_nvlink():
    from autoplan.bench.report import summary_table
    r = _banded("moe", 1.2, 1.1, ["moe"])
    r.update(best_hand=None, best_hand_any="deepseek", band_hand="deepseek", auto_vs_hand=None, auto_vs_hand_any=1.2,
             gpus=2048)
    assert "- moe: auto/hand (against deepseek, which breaks the NVLink rule) 1.20× (p10–p90 1.10–" in answer([r])
    auto = {"contender": "auto", "status": "ok", "plan": "tp=8,pp=2,dp=64", "mfu": 0.3, "fits": True,
            "respects_nvlink": True}
    r["contenders"] = [auto] + [{"contender": c, "status": "n/a"} for c in ("grid", "megatron", "megascale", "llama3",
                                                                          "fsdp", "deepseek", "published")]
    assert "(vs deepseek†)" in summary_table([r])


def test_answer_names_published_layouts_the_memory_model_prices_above_hbm():
    r = _banded("big", 2.2, 2.1, ["schedule"])
    r["contenders"] = [{"contender": "auto", "status": "ok", "tokens_per_s": 300.0, "fits": True},
                       {"contender": "published", "status": "ok", "tokens_per_s": 200.0, "fits": False,
                        "memory_gib": 91.5, "hbm_gib": 75.0, "memory_model_miss": True}]
    r.update(best_hand="published", best_hand_fits="megatron", auto_vs_hand_fits=2.2)
    text = answer([r])
    assert "memory model prices it above HBM in big (91.5 of 75 GiB)" in text
    assert "the hand baseline there" in text and "auto would be 2.20× (megatron)" in text
    r["contenders"][1].update(fits=True, memory_model_miss=False)
    assert "above HBM" not in answer([r])


def test_compact_plan():
    plan = ("tp=8,pp=16,dp=64,cp=1,ep=1,vpp=2,mbs=1,schedule=interleaved,recompute=selective,sp=on,zero=1,"
            "cp_algo=ring,order=tp-cp-ep-pp-dp")
    assert compact_plan(plan) == "tp8·pp16·dp64 zero1 mbs1 interleaved×2 rc selective sp dp-outer"


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


def test_answer_names_rule_breaking_recipes_and_what_auto_uses():
    auto = ("tp=4,pp=32,dp=16,cp=4,ep=1,vpp=2,mbs=1,schedule=zbv,recompute=none,sp=on,zero=1,cp_algo=ring,"
            "order=tp-cp-ep-dp-pp")
    moe = _record("moe", 671e9, 2048, 15.9, 1.2)
    moe.update(best_hand="llama3", best_hand_any="deepseek", auto_vs_hand_any=1.15,
               contenders=[{"contender": "auto", "plan": auto},
                           {"contender": "deepseek", "violations": ["ep-inside-nvlink"]}])
    dense = _record("dense", 405e9, 8192, 1.44, 1.89)
    dense.update(best_hand="llama3", best_hand_any="llama3", auto_vs_hand_any=1.44,
                 contenders=[{"contender": "auto", "plan": auto}])
    text = answer([moe, dense])
    assert "moe: deepseek, EP all-to-all across nodes, auto/that = 1.15×" in text
    assert "regardless of the rule the automatic plan is 1.15–1.44×" in text
    assert "zero-bubble or V-shaped pipeline schedules in 2 of 2" in text
    assert "context parallelism at ≤ 8K tokens in 2 of 2" in text


def test_a_search_past_its_time_limit_fails_the_case_but_prices_the_rest():
    from autoplan.bench import run_case

    case = Case("slow", "quick", "gpt-1.7b", "h100x64", 2048, 256, "test")
    start = time.perf_counter()
    record = run_case(case, search_timeout_s=0.3)
    assert record["status"] == "error" and "search ran past the 0.3 s limit" in record["error"]
    assert 0.3 <= record["search_s"] < 5
    rows = {r["contender"]: r for r in record["contenders"]}
    assert rows["auto"]["status"] == "error" and record["auto_vs_hand"] is None
    assert rows["grid"]["status"] == "ok" and rows["megatron"]["status"] == "ok"
    assert time.perf_counter() - start < 30


def test_search_in_a_child_returns_the_same_plans_and_reraises_user_errors(small):
    from autoplan.bench.child import search_with_limit
    from autoplan.search import SearchOptions, search

    graph, cluster, _ = small
    options = SearchOptions(top_k=2, workers=1)
    here = search(graph, cluster, global_batch=256, options=options)
    there = search_with_limit(graph, cluster, global_batch=256, options=options, limit_s=120)
    assert [c.plan for c in there.candidates] == [c.plan for c in here.candidates]
    assert [c.estimate.step_time_s for c in there.candidates] == [c.estimate.step_time_s for c in here.candidates]
    from autoplan.workload import Workload

    w = Workload.load("gpt:layers=4,hidden=32768,heads=64,vocab=51200", "h100x8", seq=2048, global_batch=1)
    big, eight = w.model, w.cluster
    with pytest.raises(UserError, match="fits no plan") as err:
        search_with_limit(big, eight, global_batch=8, options=options, limit_s=120)
    assert err.value.fix       # problem and fix both came back


def test_every_contender_has_a_plot_colour():
    from autoplan.bench.case import CONTENDERS
    from autoplan.bench.plots import COLORS
    assert set(CONTENDERS) <= set(COLORS)          # a contender without one broke write_plots (KeyError)
