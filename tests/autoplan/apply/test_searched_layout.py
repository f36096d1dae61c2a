"""`autoplan search --json` carries the block ILP's Layout, and `autoplan run plans.json` shards with it.

The ILP's layout for this small Llama is not Megatron's rule (it shards the embedding over hidden
and makes the head row-parallel), so applying the rule instead would be visible here.
"""
from __future__ import annotations

import json

import pytest

from autoplan.apply.tensor_parallel import check_placements_on_meta
from autoplan.export.load import load_layout
from autoplan.frontend.source import load_source

LLAMA = "llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256"
CLUSTER = "gpu: h100\nnum_gpus: 4\ngpus_per_node: 4\nnvlink_domain: 4\nnics_per_node: 4\n"


@pytest.fixture(scope="module")
def searched(tmp_path_factory, cli):
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "c4.yaml").write_text(CLUSTER)
    r = cli("search", LLAMA, "--cluster", str(tmp / "c4.yaml"), "--seq", "64", "--global-batch", "8",
                "--top", "20", "--json", "-o", str(tmp / "all.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    entries = json.loads((tmp / "all.json").read_text())
    tp2 = next(e for e in entries if e["plan"].startswith("tp=2,pp=1"))
    path = tmp / "plan.json"
    path.write_text(json.dumps([tp2]))
    return path, tp2


def test_search_json_carries_a_versioned_layout(searched):
    _, entry = searched
    layout = entry["layout"]
    assert layout["version"] == 1 and layout["tp"] == 2 and layout["source"] == "ilp"
    kinds = [b["kind"] for b in layout["blocks"]]
    assert kinds == ["dense0", "@pre", "@post"]
    block = layout["blocks"][0]["params"]
    # each region is Megatron's column -> row pair or left replicated (the ILP solves at the plan's
    # own micro-batch: on this 64-wide model a replicated attention can be the cheaper one), and
    # at least one region is sharded
    pairs = [("attention.q_proj.weight", "attention.o_proj.weight"),
             ("feed_forward.up_proj.weight", "feed_forward.down_proj.weight")]
    assert all((block[a], block[b]) in {("S(0)", "S(1)"), ("R", "R")} for a, b in pairs), block
    assert any(block[a] == "S(0)" for a, _ in pairs), block


def test_layout_is_what_apply_resolves(searched):
    path, entry = searched
    layout = load_layout(str(path))
    build = load_source(LLAMA).build
    applied = check_placements_on_meta(build, 2, 4, layout.placements())
    rule = check_placements_on_meta(build, 2, 4, None)
    for b in layout.blocks:
        for name, placement in b.params:
            fqns = [f"layers.{i}.{name}" for i in range(4)] if b.kind == "dense0" else [name]
            assert all(applied[f] == placement for f in fqns), (name, placement)
    assert applied != rule                      # the searched layout, not Megatron's rule, reaches apply


@pytest.mark.slow        # a multi-rank gloo run behind a shared fixture (> 10 s on 2 cores); CI runs the slow tier too
def test_run_uses_the_searched_layout_and_matches_one_process(searched, cli):
    path, _ = searched
    r = cli("run", LLAMA, "--plan", str(path), "--nproc", "4", "--steps", "2", "--seq", "64",
            "--global-batch", "8", "--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "tensor-parallel layout searched (the block ILP's" in r.stdout
    assert "\nOK: max relative error" in r.stdout
    bare = cli("run", LLAMA, "--plan", "tp=2", "--nproc", "4", "--steps", "1", "--seq", "64", "--global-batch", "8")
    assert "tensor-parallel layout by Megatron's rule" in bare.stdout
