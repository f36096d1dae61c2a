"""``autoplan explain`` through the CLI: formats, plan files, baselines, one-line errors."""
from __future__ import annotations

import json

import pytest

BAD = "tp=16,pp=4,vpp=2,schedule=interleaved,recompute=selective"
GPT3 = ("--model", "gpt3-175b", "--cluster", "h100x1024")


def test_markdown_names_the_broken_group(cli):
    r = cli("explain", BAD, *GPT3)
    assert r.returncode == 0, r.stderr
    assert "❌ FAIL | `tp-inside-nvlink` | TP group of 16 ranks (0…15) spans 2 NVLink domains over IB rail" in r.stdout
    assert "## Primitive placement: plan" in r.stdout


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_json_is_byte_identical_across_runs(cli):
    runs = [cli("explain", "tp=8,pp=8,vpp=2,schedule=zbv", *GPT3, "--format", "json", "--baseline", "tp=8,pp=8,vpp=3",
                fresh=fresh) for fresh in (False, True)]           # the second in its own interpreter (hash seed)
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    d = json.loads(runs[0].stdout)
    assert d["baseline"]["label"] == "baseline" and d["difference"]["classes"]


def test_search_json_file_to_html_with_a_recipe_baseline(cli, tmp_path):
    plans = tmp_path / "plans.json"                  # `autoplan search --json` shape: [{plan, estimate}, ...]
    plans.write_text(json.dumps([{"plan": {"tp": 8, "pp": 8, "dp": 16, "vpp": 2, "schedule": "zbv",
                                           "recompute": ["selective"], "order": ["tp", "cp", "ep", "pp", "dp"]},
                                  "estimate": {"seq": 2048, "global_batch": 1024}}]))
    out = tmp_path / "report.html"
    r = cli("explain", str(plans), *GPT3, "--baseline", "megascale", "--format", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert 'id="gantt"' in html and "megascale" in html and "schedule=zbv" in html


def test_bad_inputs_exit_2_with_one_message(cli):
    cases = [((BAD.replace("tp=16", "tq=16"), *GPT3), "unknown key 'tq'"),
             (("tp=8", *GPT3, "--baseline", "megatronn"), "neither a recipe nor a plan"),
             (("tp=8", "--model", "gpt3-175b", "--cluster", "h100x1000x"), "error: "),
             (("missing.json", *GPT3), "not found")]
    for args, words in cases:
        r = cli("explain", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and words in r.stderr and "Traceback" not in r.stderr, r.stderr
