"""``autoplan baseline`` through the CLI: JSON a plan file can be read from, one-line errors."""
from __future__ import annotations

import json

from autoplan.export.load import plan_of


def test_baseline_json(cli, tmp_path):
    r = cli("baseline", "gpt3-175b", "--cluster", "h100x1024", "--recipe", "megascale", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"recipe", "model", "cluster", "seq", "global_batch", "plan", "plan_string", "estimate"} <= set(out)
    assert (out["recipe"], out["seq"], out["global_batch"]) == ("megascale", 2048, 1024)
    plan = plan_of(out)                                         # what explain/export read
    assert plan.to_string() == out["plan_string"] == out["estimate"]["plan"]
    assert plan.order == ("tp", "cp", "ep", "pp", "dp") and out["estimate"]["fits"]
    assert r.stdout == json.dumps(out, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_baseline_table(cli):
    r = cli("baseline", "gpt3-175b", "--cluster", "h100x1024", "--recipe", "fsdp")
    assert r.returncode == 0, r.stderr
    assert "zero=3" in r.stdout and "Primitive placement" in r.stdout and "reduce-scatter" in r.stdout


def test_bad_recipe_and_inapplicable_recipe_exit_2(cli):
    for args, words in ((("--recipe", "nope"), "unknown recipe 'nope'"),
                        (("--recipe", "deepseek"), "dense model")):
        r = cli("baseline", "gpt3-175b", "--cluster", "h100x1024", *args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("error: ") and words in r.stderr and "Traceback" not in r.stderr
        assert r.stdout == ""
