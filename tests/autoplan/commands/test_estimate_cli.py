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
    assert set(e) >= FIELDS
    assert set(e["memory_breakdown_gib"]) == {"params", "grads", "optimizer", "activations", "other"}
    assert e["memory_gib"] == pytest.approx(sum(e["memory_breakdown_gib"].values()), rel=1e-4)
    assert e["tokens_per_s"] == pytest.approx(32 * 2048 / e["step_time_s"], rel=1e-4)
    assert e["tokens_per_s_per_gpu"] == pytest.approx(e["tokens_per_s"] / 16, rel=1e-4)
    assert 0 < e["mfu"] <= e["hfu"] < 1
    assert sum(p["time_s"] for p in e["primitives"]) == pytest.approx(e["comm_time_s"], rel=1e-4)
    assert sum(p["exposed_s"] for p in e["primitives"]) == pytest.approx(e["comm_exposed_s"], rel=1e-4)
    kinds = {(p["kind"], p["axis"], p["purpose"]) for p in e["primitives"]}
    assert ("reduce_scatter", "tp", "sp") in kinds and ("p2p", "pp", "activations") in kinds


def test_tp_inside_a_node_is_nvlink_and_across_nodes_is_a_violation(cli):
    inside = estimate(cli, "tp=8,order=tp-cp-ep-dp-pp")
    across = estimate(cli, "tp=8,order=dp-tp-cp-ep-pp")         # dp innermost: tp ranks 0,2,...,14 on 2 nodes
    tp_in = [p for p in inside["primitives"] if p["axis"] == "tp" and p["bytes_per_call"] > 1e6]
    tp_out = [p for p in across["primitives"] if p["axis"] == "tp" and p["bytes_per_call"] > 1e6]
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
    ("pp=4,mbs=8,schedule=zb-h2", "micro-batches cannot fill"),
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


PLANS = ["tp=8,pp=2,mbs=1,recompute=selective", "tp=2,dp=8,zero=3", "tp=4,pp=4,mbs=1,schedule=gpipe"]


def _many(cli, path):
    return cli("estimate", MODEL, "--cluster", "h100x16", "--plans", str(path), "--seq", "2048",
               "--global-batch", "32")


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_plans_file_prices_every_plan_in_order_as_single_estimates_do(cli, tmp_path):
    text = tmp_path / "plans.txt"
    text.write_text("# a sweep\n" + PLANS[0] + "\n\n" + "\n".join(PLANS[1:]) + "\n")
    out = _many(cli, text)
    assert out.returncode == 0, out.stderr
    many = json.loads(out.stdout)
    assert [e["plan"].split(",")[:2] for e in many] == [["tp=8", "pp=2"], ["tp=2", "pp=1"], ["tp=4", "pp=4"]]
    assert many == [estimate(cli, p) for p in PLANS]
    listed = tmp_path / "plans.json"
    listed.write_text(json.dumps(PLANS[::-1]))
    out = _many(cli, listed)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == many[::-1]


@pytest.mark.parametrize("content, needle", [
    ("tp=8\ntp=3\n", "line 2: plan does not fit the cluster"),
    ('["tp=8", 7]', "entry 1"),
    ("# nothing\n", "holds no plan"),
    ("tp=4,pp=4,mbs=16,schedule=zb-h1\n", "plan 1 (tp=4,pp=4"),
])
def test_bad_plans_files_name_the_entry(cli, tmp_path, content, needle):
    path = tmp_path / "plans.txt"
    path.write_text(content)
    out = _many(cli, path)
    assert out.returncode == 2, out.stdout
    assert needle in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_fsdp_policy_flags_change_zero3_pricing(cli):
    base = estimate(cli, "dp=16,mbs=1,zero=3")
    off = estimate(cli, "dp=16,mbs=1,zero=3", "h100x16", "--fsdp-reshard", "off")
    gathers = [sum(p["calls_per_step"] for p in e["primitives"] if p["axis"] == "dp" and p["kind"] == "all_gather")
               for e in (base, off)]
    # one gather per FSDP unit (the root and 4 blocks): reshard on, 2 micro-batches, every forward
    # gathers the 5 and every backward the 3 not kept gathered; off, the first forward only
    assert gathers == [2 * 5 + 2 * 3, 5]
    assert off["memory_gib"] > base["memory_gib"]
    deep = estimate(cli, "dp=16,mbs=1,zero=3", "h100x16", "--fsdp-prefetch", "3")
    # two more prefetched units held (at the peak they sit under the last stage's loss buffers
    # on this small model, so the peak itself need not grow)
    assert deep["memory_gib"] >= base["memory_gib"] and deep["step_time_s"] <= base["step_time_s"]
    step = estimate(cli, "pp=2,dp=8,mbs=1,zero=2", "h100x16")
    every = estimate(cli, "pp=2,dp=8,mbs=1,zero=2", "h100x16", "--fsdp-grad-sync", "microbatch")
    reduces = [sum(p["calls_per_step"] for p in e["primitives"] if p["axis"] == "dp" and p["kind"] == "reduce_scatter")
               for e in (step, every)]
    assert reduces[1] == 4 * reduces[0]            # 4 micro-batches per data-parallel rank, reduced each time
    # the unsharded fp32 accumulator (4 B per parameter) gives way to the fp32 shard (4/8)
    assert every["memory_breakdown_gib"]["grads"] == pytest.approx(step["memory_breakdown_gib"]["grads"] / 9, rel=1e-3)
    bad = cli("estimate", MODEL, "--cluster", "h100x16", "--plan", "zero=3", "--fsdp-prefetch", "0")
    assert bad.returncode == 2 and "--fsdp-prefetch 0 is out of range" in bad.stderr
@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
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


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_kernels_flag_prices_megatron_cores_fused_swiglu(cli):
    llama = "llama:layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000"
    args = ("estimate", llama, "--cluster", "h100x16", "--plan", "tp=2,dp=8,mbs=1,sp=on", "--seq", "2048",
            "--global-batch", "32", "--json")
    eager, fused = (json.loads(cli(*args, *extra).stdout) for extra in ((), ("--kernels", "megatron-core")))
    act = [e["memory_breakdown_gib"]["activations"] for e in (eager, fused)]
    # one micro-batch of 4 layers in flight: 4 SiLU(gate) of s·ffn/tp bf16 elements fewer, and
    # Megatron-Core's loss (in-place softmax, 6 bytes per local logit) against DTensor's
    # vocabulary-parallel one (12): 6 bytes fewer per logit of s·V/tp
    swiglu = 4 * 2048 * 2816 / 2 * 2
    loss = 2048 * 32000 / 2 * (12 - 6)
    assert act[0] - act[1] == pytest.approx((swiglu + loss) / 1024 ** 3, rel=0.02)
    assert fused["step_time_s"] == eager["step_time_s"]


def test_fp8_on_a100_exits_2_with_the_precisions_it_runs(cli):
    out = cli("estimate", MODEL, "--cluster", "a100x16", "--plan", "tp=2,precision=fp8", "--global-batch", "32")
    assert out.returncode == 2, out.stdout
    assert "precision=fp8 needs FP8 tensor cores (Hopper or Blackwell), which a100-80gb lacks" in out.stderr
    assert "use precision bf16" in out.stderr and "Traceback" not in out.stderr
    mx = cli("estimate", MODEL, "--cluster", "h100x16", "--plan", "tp=2,precision=mxfp8", "--global-batch", "32")
    assert mx.returncode == 2 and "block-scaled FP8 tensor cores (Blackwell), which h100 lacks" in mx.stderr
