"""`autoplan estimate`: the JSON contract, the NVLink rule, and bad input."""
import json

import pytest

MODEL = "gpt:layers=4,hidden=1024,heads=16,vocab=32000"
FIELDS = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "model_flops_per_step", "memory_gib",
          "memory_breakdown_gib", "fits", "bubble_fraction", "comm_exposed_s", "violations", "primitives"}


def estimate(cli, plan, cluster="h100x16", *extra):
    out = cli("estimate", MODEL, "--cluster", cluster, "--plan", plan, "--seq", "2048", "--global-batch", "32",
              "--json", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_json_fields_and_consistent_numbers(cli):
    e = estimate(cli, "tp=8,pp=2,mbs=1,recompute=selective")
    assert FIELDS <= set(e)
    assert set(e["memory_breakdown_gib"]) == {"params", "grads", "optimizer", "activations", "other"}
    assert e["memory_gib"] == pytest.approx(sum(e["memory_breakdown_gib"].values()), rel=1e-4)
    assert e["tokens_per_s"] == pytest.approx(32 * 2048 / e["step_time_s"], rel=1e-4)
    assert e["tokens_per_s_per_gpu"] == pytest.approx(e["tokens_per_s"] / 16, rel=1e-4)
    assert 0 < e["mfu"] <= e["hfu"] < 1
    assert sum(p["time_s"] for p in e["primitives"]) == pytest.approx(e["comm_time_s"], rel=1e-4)
    assert sum(p["exposed_s"] for p in e["primitives"]) == pytest.approx(e["comm_exposed_s"], rel=1e-4)
    kinds = {(p["kind"], p["dim"]) for p in e["primitives"]}
    assert ("reduce_scatter", "sp") in kinds and ("p2p", "pp") in kinds


def test_tp_inside_a_node_is_nvlink_and_across_nodes_is_a_violation(cli):
    inside = estimate(cli, "tp=8,order=tp-cp-ep-dp-pp")
    across = estimate(cli, "tp=8,order=dp-tp-cp-ep-pp")         # dp innermost: tp ranks 0,2,...,14 on 2 nodes
    tp_in = [p for p in inside["primitives"] if p["dim"] in ("tp", "sp") and p["bytes_per_call"] > 1e6]
    tp_out = [p for p in across["primitives"] if p["dim"] in ("tp", "sp") and p["bytes_per_call"] > 1e6]
    assert tp_in and all(p["level"] == "nvlink" for p in tp_in)
    assert tp_out and all(p["level"] != "nvlink" for p in tp_out)
    assert inside["violations"] == []
    assert [v["rule"] for v in across["violations"]] == ["tp-inside-nvlink"]
    assert "2 NVLink domains" in across["violations"][0]["text"]
    assert across["step_time_s"] > inside["step_time_s"]


@pytest.mark.parametrize("plan, needle", [
    ("tp=8,foo=2", "unknown key 'foo'"),
    ("tp=3", "does not divide 16 GPUs"),
    ("tp=32", "does not divide 16 GPUs"),
    ("tp=8,dp=4", "but the cluster has 16 GPUs"),
    ("cp=16,tp=1 --seq 1000", "does not divide the sequence length 1000"),
    ("ep=2", "has no experts"),
    ("pp=2,schedule=interleaved,vpp=1", "interleaved needs vpp"),
    ("pp=4,mbs=8", "micro-batches cannot fill"),
])
def test_bad_plans_exit_2_with_one_message(cli, plan, needle):
    plan, *extra = plan.split()
    out = cli("estimate", MODEL, "--cluster", "h100x16", "--plan", plan, "--global-batch", "32", *extra)
    assert out.returncode == 2, out.stdout
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_unknown_cluster_lists_names_and_grammar(cli):
    out = cli("estimate", MODEL, "--cluster", "h100x1023", "--plan", "tp=8")
    assert out.returncode == 2 and "NVLink domain" in out.stderr
    out = cli("estimate", MODEL, "--cluster", "dgx-moon", "--plan", "tp=8")
    assert out.returncode == 2 and "h100x1024" in out.stderr and "<gpu>x<N>" in out.stderr


def test_tp6_on_8_gpu_domains_is_a_violation(cli):
    """tp=6 groups are 0…5, 6…11, …: the second straddles two NVLink domains (rules checks every group)."""
    r = cli("estimate", "gpt:layers=4,hidden=768,heads=12,vocab=512", "--cluster", "h100x48", "--plan", "tp=6",
            "--global-batch", "64", "--json")
    assert r.returncode == 0, r.stderr
    violations = json.loads(r.stdout)["violations"]
    assert [v["rule"] for v in violations] == ["tp-inside-nvlink"]
    assert "(6…11) spans 2 NVLink domains" in violations[0]["text"]


def test_memory_margin_sets_the_limit_fits_reads(cli):
    e = estimate(cli, "tp=8,pp=2,mbs=1,recompute=selective")
    assert e["memory_margin_gib"] == 4.0                         # the default
    assert e["memory_limit_gib"] == pytest.approx(e["hbm_gib"] - 4.0, rel=1e-5)
    tight = e["hbm_gib"] - 0.9 * e["memory_gib"]                 # leaves 10 % too little
    over = estimate(cli, "tp=8,pp=2,mbs=1,recompute=selective", "h100x16", "--memory-margin", f"{tight:.3f}")
    assert over["fits"] is False and over["memory_gib"] == pytest.approx(e["memory_gib"], rel=1e-5)
    assert [v["rule"] for v in over["violations"]] == ["memory"]
    roomy = estimate(cli, "tp=8,pp=2,mbs=1,recompute=selective", "h100x16", "--memory-margin",
                     f"{e['hbm_gib'] - 1.1 * e['memory_gib']:.3f}")
    assert roomy["fits"] is True and roomy["violations"] == []


def test_bad_memory_margin_is_one_message(cli):
    out = cli("estimate", MODEL, "--cluster", "h100x16", "--plan", "tp=8", "--memory-margin", "-1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--memory-margin -1 GiB" in out.stderr and "fix:" in out.stderr
