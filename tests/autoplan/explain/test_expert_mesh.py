"""``explain`` of a folded MoE plan names the expert mesh's groups and the level each reaches.

Expected groups are written out from Megatron-Core's expert rank layout (etp innermost, then ep,
then edp; pp outermost): with tp=2, dp=16 a stage is 32 ranks; ep=8, etp=1 gives EP groups of 8
consecutive ranks (one 8-GPU NVLink domain each) and EDP groups of the ranks 8 apart (one per
node: IB); ep=32 gives one EP group over 4 nodes, which breaks the NVLink rule.
"""
from __future__ import annotations

import json

import pytest

MOE = "moe:layers=4,hidden=1024,heads=8,kv_heads=4,ffn=2816,vocab=8192,experts=64,topk=2,moe_ffn=1024"


def explain(cli, plan, fmt):
    out = cli("explain", plan, "--model", MOE, "--cluster", "h100x64", "--seq", "2048", "--global-batch", "64",
              "--format", fmt)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("plan,ep_first,edp_first,ep_level,holds", [
    ("tp=2,pp=2,dp=16,ep=8,etp=1", list(range(8)), [0, 8, 16, 24], "NVLink", True),
    ("tp=2,pp=2,dp=16,ep=32,etp=1", list(range(32)), [0], "IB rail", False),
])
def test_the_expert_mesh_groups_and_levels_are_named(cli, plan, ep_first, edp_first, ep_level, holds):
    groups = {g["kind"]: g for g in json.loads(explain(cli, plan, "json"))["expert_mesh"]}
    ep, etp, edp = groups["EP"], groups["ETP"], groups["EDP"]
    assert ep["first"] == ep_first and ep["size"] == len(ep_first) and ep["count"] == 64 // len(ep_first)
    assert ep["level"] == ep_level and ep["rule"] == "ep-inside-nvlink" and ep["inside_nvlink"] is holds
    assert ep["crossing"] == ([] if holds else ep_first)
    assert etp["size"] == 1 and etp["rule"] is None
    assert edp["first"] == edp_first
    assert edp["level"] == ("IB rail" if len(edp_first) > 1 else "none (one rank)")


def test_markdown_names_the_groups_and_an_unfolded_plan_has_no_section(cli):
    md = explain(cli, "tp=4,pp=2,dp=8,ep=8,etp=2", "md")
    section = md.split("## Expert mesh")[1].split("##")[0]
    assert "etp·ep·edp = 2·8·2 of the same 32 GPUs" in section
    # ep stride etp=2: 0, 2, …, 14 spans two 8-GPU domains; expert TP pairs 0…1 stay inside one
    assert "EP (token dispatch/combine all-to-all, every MoE layer): 8 groups of 8, rank 0's is 0, 2, …, 14" in section
    assert "`ep-inside-nvlink` broken" in section and "`etp-inside-nvlink` holds" in section
    assert "EDP (expert gradient reduction, once per step): 32 groups of 2, rank 0's is 0, 16" in section
    assert "expert TP groups of 2 ranks (0…1, …)" in md            # the rule verdict reads the expert layout
    assert "expert_mesh" not in json.loads(explain(cli, "tp=2,pp=2,dp=16,ep=8", "json"))
    assert "## Expert mesh" not in explain(cli, "tp=2,pp=2,dp=16,ep=8", "md")
