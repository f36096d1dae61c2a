"""Plain HF Llama and Mixtral run under the plans *search returns for them* (issue 14 acceptance).

As a user would: ``autoplan search MODEL.py --cluster c4.yaml --json -o plans.json`` on a 4-GPU
cluster YAML, then ``autoplan run MODEL.py --plan PICK.json --nproc 4 --check`` for the search's
best plan, its best plan with tensor parallelism (run with the block ILP's layout stored in the
file) and, for Mixtral, its best plan with expert parallelism.  Each pick is a one-entry file cut
from the search's own JSON, so ``run`` reads the plan and layout exactly as search wrote them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cli import main

MODELS = Path(__file__).parent / "models"
CLUSTER = "gpu: h100\nnum_gpus: 4\ngpus_per_node: 4\nnvlink_domain: 4\n"
SEQ, BATCH = 16, 8
PICKS = {"hf_llama": ("best", "tp"), "hf_mixtral": ("best", "tp", "ep")}


def _plan(c: dict) -> dict:
    text = c["plan"] if isinstance(c["plan"], str) else c["estimate"]["plan"]
    return {k: v for k, v in (kv.split("=", 1) for kv in text.split(","))}


def _pick(candidates: list[dict], want: str) -> dict:
    if want == "best":
        return candidates[0]
    return next(c for c in candidates if int(_plan(c)[want]) > 1)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """model stem → (its model file, the search's candidates, a dir for pick files)."""
    out = {}
    for stem in PICKS:
        tmp = tmp_path_factory.mktemp(stem)
        (tmp / "c4.yaml").write_text(CLUSTER)
        model = str(MODELS / f"{stem}.py")
        assert main(["search", model, "--cluster", str(tmp / "c4.yaml"), "--seq", str(SEQ), "--global-batch",
                     str(BATCH), "--top", "12", "--workers", "1", "--json", "-o", str(tmp / "plans.json")]) == 0
        out[stem] = (model, json.loads((tmp / "plans.json").read_text()), tmp)
    return out


CASES = [(stem, want) for stem, wants in PICKS.items() for want in wants]


@pytest.mark.slow
@pytest.mark.parametrize("stem, want", CASES, ids=[f"{s}-{w}" for s, w in CASES])
def test_searched_plan_runs_and_matches_one_process(searched, capsys, stem, want):
    model, candidates, tmp = searched[stem]
    pick = _pick(candidates, want)
    path = tmp / f"{want}.json"
    path.write_text(json.dumps([pick]))
    capsys.readouterr()
    code = main(["run", model, "--plan", str(path), "--nproc", "4", "--steps", "2", "--seq", str(SEQ),
                 "--global-batch", str(BATCH), "--optimizer", "sgd", "--lr", "0.02", "--check"])
    out, err = capsys.readouterr()
    assert code == 0 and "\nOK: max relative error" in out, (out[-2000:], err[-2000:])
    if int(_plan(pick)["tp"]) > 1:
        assert "layout" in pick
        assert "tensor-parallel layout searched (the block ILP's" in out


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_search_offers_tp_and_ep_plans_for_the_hf_models(searched):
    """The picks exist: the search of each HF model returns tp plans with a layout (and ep plans
    for Mixtral), so the slow test above runs what it says."""
    for stem, wants in PICKS.items():
        _, candidates, _ = searched[stem]
        for want in wants:
            pick = _pick(candidates, want)
            assert want == "best" or int(_plan(pick)[want]) > 1
            assert want != "tp" or "layout" in pick
