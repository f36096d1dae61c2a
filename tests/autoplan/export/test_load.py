"""PLAN arguments: plan strings, Plan.to_json files and `autoplan search --json` lists."""
from __future__ import annotations

import json

import pytest

from autoplan.errors import UserError
from autoplan.export.load import entry_value, load_plan, read_json
from autoplan.plan import Plan

PLAN = "tp=4,pp=2,dp=2,mbs=2,zero=3"


def test_plan_string_and_to_json_file(tmp_path):
    plan = Plan.parse(PLAN)
    assert load_plan(PLAN) == plan
    f = tmp_path / "plan.json"
    f.write_text(plan.to_json())
    assert load_plan(str(f)) == plan


def test_search_output_takes_the_first_candidate(tmp_path):
    f = tmp_path / "search.json"
    f.write_text(json.dumps([{"plan": PLAN, "estimate": {"step_s": 1.0, "global_batch": 64, "seq": 4096}},
                             {"plan": "tp=8", "estimate": {}}]))
    assert load_plan(str(f)) == Plan.parse(PLAN)
    assert entry_value(read_json(str(f)), "global_batch") == 64
    g = tmp_path / "dicts.json"
    g.write_text(json.dumps([{"plan": Plan.parse(PLAN).to_dict(), "global_batch": 32}]))
    assert load_plan(str(g)) == Plan.parse(PLAN) and entry_value(read_json(str(g)), "global_batch") == 32


@pytest.mark.parametrize("content, match", [
    ("[]", "empty list"), ("{not json", "cannot read plan file"), ('{"x": 1}', "holds no plan"),
    ('[{"plan": "tp=zz"}]', "is not an integer"),
])
def test_bad_plan_files_are_user_errors(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(UserError, match=match):
        load_plan(str(f))


def test_missing_file_is_a_user_error():
    with pytest.raises(UserError, match="not found"):
        load_plan("nope/plans.json")
