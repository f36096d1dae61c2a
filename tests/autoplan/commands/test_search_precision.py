"""Precision as a search dimension (``search --precision``) and the saving ``explain`` and the
search table show: the same plan priced again in bf16."""
import json

import pytest

import topologies
from autoplan.errors import UserError
from autoplan.plan import Plan, search_precisions

BIG = "llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000"
ARGS = [BIG, "--cluster", "h100x8", "--global-batch", "32", "--samples", "0", "--objective", "point"]


@pytest.mark.parametrize("cluster, auto", [("h100x8", ("fp8", "bf16")), ("b200x8", ("mxfp8", "bf16")),
                                           ("a100x8", ("bf16",))])
def test_auto_is_the_gpus_fp8_recipe_then_bf16(cluster, auto):
    gpu = topologies.load(cluster).gpu
    assert search_precisions("auto", gpu.name, gpu.precisions) == auto
    assert search_precisions("bf16, fp8-delayed", "h100", topologies.load("h100x8").gpu.precisions) == \
        ("bf16", "fp8-delayed")


def test_a_precision_the_gpu_lacks_or_an_unknown_one_is_refused():
    h100 = topologies.load("h100x8").gpu
    with pytest.raises(UserError, match="h100 has no tensor cores for it"):
        search_precisions("mxfp8", h100.name, h100.precisions)
    with pytest.raises(UserError, match="unknown precision"):
        search_precisions("fp4", h100.name, h100.precisions)


def test_search_auto_returns_fp8_plans_and_says_what_they_save(cli):
    out = cli("search", *ARGS, "--precision", "auto", "--json")
    assert out.returncode == 0, out.stderr
    plans = [Plan.parse(c["plan"]) for c in json.loads(out.stdout)]
    assert plans and plans[0].precision == "fp8"
    text = cli("search", *ARGS, "--precision", "auto")
    assert text.returncode == 0, text.stderr
    assert "#1 precision fp8:" in text.stdout and "for the same plan in bf16 — saves" in text.stdout


def test_default_search_stays_bf16(cli):
    out = cli("search", *ARGS, "--json")
    assert out.returncode == 0, out.stderr
    assert all("precision" not in c["plan"] for c in json.loads(out.stdout))


def test_search_refuses_mxfp8_on_h100(cli):
    out = cli("search", *ARGS, "--precision", "mxfp8")
    assert out.returncode == 2 and "error:" in out.stderr and "fix:" in out.stderr and "Traceback" not in out.stderr


def test_explain_prices_the_same_plan_in_bf16(cli):
    plan = "tp=2,dp=4,precision=fp8"
    ex = cli("explain", "--model", BIG, "--cluster", "h100x8", "--global-batch", "32", plan, "--format", "json")
    assert ex.returncode == 0, ex.stderr
    saving = json.loads(ex.stdout)["precision"]
    bf16 = cli("estimate", BIG, "--cluster", "h100x8", "--global-batch", "32", "--plan", "tp=2,dp=4", "--json",
               "--samples", "0")
    assert bf16.returncode == 0, bf16.stderr
    step = json.loads(bf16.stdout)["step_time_s"]
    assert saving["bf16_step_time_s"] == pytest.approx(step, rel=1e-3)
    assert saving["saving"] == pytest.approx(1 - saving["step_time_s"] / step, rel=1e-3) and saving["saving"] > 0.05
    md = cli("explain", "--model", BIG, "--cluster", "h100x8", "--global-batch", "32", plan)
    assert "## Precision" in md.stdout and "saves" in md.stdout
    plain = cli("explain", "--model", BIG, "--cluster", "h100x8", "--global-batch", "32", "tp=2,dp=4",
                "--format", "json")
    assert "precision" not in json.loads(plain.stdout)


def test_explain_says_where_recomputed_layers_rerun_in_bf16(cli):
    """Under a full-recompute FP8 plan with ``--fp8-recompute bf16`` the saving shrinks to the first
    forward's and the note says why; with TE's own checkpoint (the default) it does not."""
    plan = "tp=2,dp=4,recompute=full,precision=fp8"
    args = ["explain", "--model", BIG, "--cluster", "h100x8", "--global-batch", "32", plan, "--format", "json"]
    te, torch = (json.loads(cli(*args, *flags).stdout)["precision"] for flags in ([], ["--fp8-recompute", "bf16"]))
    assert (te["recompute_in_bf16"], torch["recompute_in_bf16"]) == (False, True)
    assert te["bf16_step_time_s"] == torch["bf16_step_time_s"] and 0 < torch["saving"] < te["saving"]
    md = cli(*args[:-2], "--fp8-recompute", "bf16")
    assert "rerun and back-propagate in bf16" in md.stdout


@pytest.mark.slow
def test_llama3_70b_on_1024_h100_at_8k_searches_to_fp8_plans(cli):
    """The issue's acceptance command returns FP8 plans (about 30 s with one worker)."""
    out = cli("search", "llama3-70b", "--cluster", "h100x1024", "--seq", "8192", "--global-batch", "1024",
              "--precision", "auto", "--json")
    assert out.returncode == 0, out.stderr
    assert all(Plan.parse(c["plan"]).precision == "fp8" for c in json.loads(out.stdout))


def test_evidence_flags_a_precision_no_reproduced_run_covers(setup):
    """fp8-delayed (FP8-LM, llm-foundry pairs) is covered, tensorwise fp8 not yet; an FP8 plan's MFU
    is compared with the best published FP8 run's, not the bf16 one's."""
    from autoplan.cost.evidence import coverage, flags

    _, _, est = setup(BIG, "h100x8")
    by, mfu = {}, {}
    for precision in ("bf16", "fp8", "fp8-delayed"):
        plan = Plan.parse(f"dp=8,mbs=4,precision={precision}", num_gpus=8)
        e = est.estimate(plan, 32)
        by[precision], mfu[precision] = {f.regime: f.text for f in flags(plan, e, moe=False)}, e.mfu
    assert "precision" in by["fp8"] and "precision" not in by["fp8-delayed"] and "precision" not in by["bf16"]
    assert coverage()["max_mfu"]["dense-fp8"][0] > coverage()["max_mfu"]["dense"][0]
    assert coverage()["max_mfu"]["dense"][0] < mfu["fp8-delayed"] < coverage()["max_mfu"]["dense-fp8"][0]
    assert "mfu" not in by["fp8-delayed"]
