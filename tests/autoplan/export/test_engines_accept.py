"""The exports load in the engines: torchtitan 0.3.0's own config loader puts every parallelism value where
torchtitan reads it, and Megatron-LM's validate_args constraints hold, for hand-made plans covering
every feature (fast tier), the committed top-5 plans of the six searches (fast tier) and what those
searches return today (slow tier).  Expected values are derived here from the plan, not from the
exporter."""
from __future__ import annotations

import pytest

from autoplan.commands.export import model_shape
from autoplan.export import export
from autoplan.plan import Plan


def _layers(model: str) -> int:
    return model_shape(model, 60.0).layers


# torch.distributed.pipelining schedule names (torchtitan's pipeline_parallel_schedule)
TORCH_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble",
                  "zb-h2": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
AC_CLASS = {"none": "NoneType", "full": "FullAC.Config", "op": "SelectiveAC.Config", "selective": "SelectiveAC.Config"}
EXPERTS = {"mixtral-8x22b": 8, "deepseek-v3": 256}        # the zoo models' routed experts
HAND_PLANS = [        # (model, plan, global batch, seq): every feature once, small enough to read
    ("llama3-8b", "tp=2,pp=2,dp=2,zero=3,schedule=interleaved,vpp=2,mbs=2,recompute=full", 16, 4096),
    ("llama3-8b", "tp=4,sp=off,dp=2,zero=0,recompute=op", 8, 8192),
    ("llama3-8b", "cp=4,dp=4,zero=2,recompute=selective", 16, 8192),
    ("llama3-70b", "tp=2,pp=4,dp=2,schedule=zbv,layers=9-11-11-9-9-11-11-9,recompute=full:2", 32, 8192),
    ("llama3-405b", "tp=8,pp=2,dp=4,schedule=dualpipev,recompute=full-none", 64, 8192),
    ("deepseek-v3", "tp=2,pp=2,dp=8,ep=4,schedule=zbv,zero=1", 64, 4096),
    ("deepseek-v3", "tp=1,pp=2,dp=8,ep=8,cp=2,schedule=1f1b,zero=0", 64, 4096),
    ("mixtral-8x22b", "tp=2,pp=2,dp=4,ep=4,schedule=dualpipev,cp=2,cp_algo=usp,zero=3", 32, 4096),
    ("gpt3-175b", "tp=8,pp=4,dp=2,schedule=zb-h1,cp=2,cp_algo=ulysses", 16, 2048),
]


def _parse(text: str, num_gpus: int | None = None) -> Plan:
    return Plan.parse(text, num_gpus=num_gpus)


def expected_torchtitan(plan: Plan, num_layers: int, global_batch: int, seq: int) -> dict:
    """Where torchtitan 0.3.0 must read each of the plan's values (torchtitan/config/configs.py)."""
    fsdp = plan.zero > 0 or plan.ep > 1           # EP borrows dp_shard ranks: no DDP-only form with ep
    par = {"tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
           "context_parallel_degree": plan.cp,
           # no expert TP in 0.3: the plan's experts, split over etp (folded) or tp, become whole
           # experts over ep·etp ranks
           "expert_parallel_degree": plan.ep * ((plan.tp if plan.etp is None else plan.etp) if plan.ep > 1 else 1),
           "data_parallel_shard_degree": plan.dp if fsdp else 1,
           "data_parallel_replicate_degree": 1 if fsdp else plan.dp,
           "enable_sequence_parallel": plan.sp or plan.tp == 1,
           "pipeline_parallel_schedule": TORCH_SCHEDULE[plan.schedule],
           "pipeline_parallel_microbatch_size": plan.mbs}
    if plan.zero >= 3 and plan.dp > 1:
        par["fsdp_reshard_after_forward"] = "always"
    elif fsdp and plan.dp > 1:
        par["fsdp_reshard_after_forward"] = "never"
    training = {"global_batch_size": global_batch, "seq_len": seq,
                "local_batch_size": global_batch // plan.dp if plan.pp > 1 else plan.mbs}
    if plan.pp > 1:
        training["disable_cuda_graphs"] = True
    strongest = max(plan.recompute, key=lambda r: ("none", "selective", "op").index(r) if r in
                    ("none", "selective", "op") else 3)
    return {"parallelism": par, "training": training,
            "activation_checkpoint": AC_CLASS["full" if strongest.startswith("full") else strongest]}


def check_torchtitan(plan: Plan, num_layers: int, global_batch: int, seq: int, loaded: dict) -> None:
    assert "error" not in loaded, loaded["error"]
    want = expected_torchtitan(plan, num_layers, global_batch, seq)
    for section in ("parallelism", "training"):
        got = {k: loaded[section][k] for k in want[section]}
        assert got == want[section], (plan.to_string(), section)
    assert loaded["activation_checkpoint"] == want["activation_checkpoint"], plan.to_string()
    par = loaded["parallelism"]
    assert "error" not in loaded["parallel_dims"], loaded["parallel_dims"]
    # the sparse mesh's efsdp = dp_shard·cp·tp / ep must be whole (parallel_dims.py build_mesh)
    assert par["data_parallel_shard_degree"] * par["context_parallel_degree"] * par["tensor_parallel_degree"] \
        % par["expert_parallel_degree"] == 0
    if plan.pp > 1:
        parts = par["module_fqns_per_model_part"]
        layers = [sum(m.startswith("layers.") for m in part) for part in parts]
        assert tuple(layers) == plan.stage_layers(num_layers), plan.to_string()
        flat = [m for part in parts for m in part]
        assert flat == ["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)] + ["norm", "lm_head"]
        ends = {"tok_embeddings", "norm", "lm_head"}     # built by torchtitan (its layer count may differ)
        assert ends <= set(loaded["modules"]), ends - set(loaded["modules"])


def check_megatron(rules, plan: Plan, model: str, num_layers: int, global_batch: int, seq: int,
                   nvlink_domain: int | None = None) -> None:
    out = export(plan, "megatron", num_layers=num_layers, global_batch=global_batch, seq=seq,
                 nvlink_domain=nvlink_domain)
    argv = rules.command_words(out.text)
    world = plan.tp * plan.cp * plan.pp * plan.dp
    failures = rules.check(argv, world_size=world, model={"num_experts": EXPERTS.get(model)})
    assert failures == [], (plan.to_string(), failures)
    if plan.ep > 1:           # the plan's expert layout, carried: etp (tp unless folded), its dispatcher
        assert argv[argv.index("--expert-tensor-parallel-size") + 1] == str(plan.tp if plan.etp is None else plan.etp)
        assert argv[argv.index("--expert-model-parallel-size") + 1] == str(plan.ep)
        dispatcher = argv[argv.index("--moe-token-dispatcher-type") + 1]
        assert dispatcher == {"alltoall": "alltoall", "deepep": "flex"}[plan.dispatcher]
        assert ("--overlap-moe-expert-parallel-comm" in argv) == (plan.ep_overlap or "--delay-wgrad-compute" in argv)


def _torchtitan_requests(cases):
    requests = []
    for model, plan, batch, seq in cases:
        out = export(plan, "torchtitan", num_layers=_layers(model), global_batch=batch, seq=seq, model=model)
        requests.append((out.argv, plan.tp * plan.cp * plan.pp * plan.dp))
    return requests


def _hand_cases():
    return [(model, _parse(text), batch, seq) for model, text, batch, seq in HAND_PLANS]


def test_hand_plans_load_in_torchtitan(torchtitan_load):
    cases = _hand_cases()
    for (model, plan, batch, seq), loaded in zip(cases, torchtitan_load(_torchtitan_requests(cases))):
        check_torchtitan(plan, _layers(model), batch, seq, loaded)


def test_hand_plans_pass_megatron_validate_args(megatron_rules):
    for model, plan, batch, seq in _hand_cases():
        check_megatron(megatron_rules, plan, model, _layers(model), batch, seq)


def _top_cases(top_plan_cases):
    _, cases = top_plan_cases
    return [(c["model"], _parse(p), c["global_batch"], c["seq"]) for c in cases for p in c["plans"]]


def test_committed_top_plans_pass_megatron_validate_args(megatron_rules, top_plan_cases):
    cases = _top_cases(top_plan_cases)
    assert len(cases) == 30
    for model, plan, batch, seq in cases:
        check_megatron(megatron_rules, plan, model, _layers(model), batch, seq, nvlink_domain=8)


@pytest.mark.slow
def test_committed_top_plans_load_in_torchtitan(torchtitan_load, top_plan_cases):
    cases = _top_cases(top_plan_cases)
    for (model, plan, batch, seq), loaded in zip(cases, torchtitan_load(_torchtitan_requests(cases))):
        check_torchtitan(plan, _layers(model), batch, seq, loaded)


@pytest.fixture(scope="module")
def searched_cases(top_plan_cases):
    """The six searches run again today (about 70 s on 2 cores)."""
    make, _ = top_plan_cases
    return [(model, _parse(p), batch, seq) for model, cluster, seq, batch in make.CASES
            for p in make.top_plans(model, cluster, seq, batch)]


@pytest.mark.slow
def test_searched_top_plans_load_in_both_engines(searched_cases, torchtitan_load, megatron_rules):
    assert len(searched_cases) == 30
    for (model, plan, batch, seq), loaded in zip(searched_cases, torchtitan_load(_torchtitan_requests(searched_cases))):
        check_torchtitan(plan, _layers(model), batch, seq, loaded)
        check_megatron(megatron_rules, plan, model, _layers(model), batch, seq, nvlink_domain=8)


@pytest.mark.parametrize("argv, where", [
    (["--micro-batch-size", "1", "--use-megatron-fsdp"], "A:1169"),           # ZeRO-2/3 without fsdp_dtensor
    (["--micro-batch-size", "1", "--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"], "A:583"),
    (["--micro-batch-size", "1", "--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
      "--hierarchical-context-parallel-sizes", "4", "2"], "A:582"),
    (["--micro-batch-size", "1", "--delay-wgrad-compute"], "TC:3075"),
    (["--micro-batch-size", "1", "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
      "Et|tt|ttL"], "A:945"),
    (["--micro-batch-size", "1", "--num-layers", "8", "--recompute-granularity", "full"], "TC:1913"),
    (["--micro-batch-size", "1", "--cp-comm-type", "ring"], "A:3221"),
    (["--micro-batch-size", "1", "--context-parallel-rotate-method", "alltoall"], "argparse"),
])
def test_the_checker_refuses_what_megatron_refuses(megatron_rules, argv, where):
    failures = megatron_rules.check(argv, world_size=64, model={})
    assert any(f.startswith(where) for f in failures), failures


# ---- precision (issue 35): plans as `autoplan search --json` writes them, every recipe ----------------
# (model, plan JSON fields, global batch, seq, GPU the run is for)
PRECISION_PLANS = [
    ("llama3-70b", {"tp": 4, "pp": 4, "dp": 4, "zero": 1, "schedule": "interleaved", "vpp": 2,
                    "precision": "fp8"}, 64, 8192, "h100"),
    ("llama3-8b", {"tp": 2, "dp": 8, "zero": 3, "precision": "fp8"}, 64, 8192, "h100"),
    ("llama3-8b", {"tp": 2, "pp": 2, "dp": 4, "zero": 3, "precision": "fp8-rowwise"}, 32, 4096, "h100"),
    ("llama3-70b", {"tp": 8, "pp": 2, "dp": 2, "zero": 1, "precision": "fp8-delayed"}, 32, 8192, "h100"),
    ("llama3-8b", {"tp": 2, "dp": 4, "zero": 2, "precision": "mxfp8"}, 32, 8192, "b200"),
]
# what each precision must become in torchtitan 0.3.0 (its float8 recipes are rowwise only: AXISWISE
# input casts) and Megatron-LM (--fp8-recipe), written from the engines' sources, not the exporter
TORCHTITAN_LINEAR = {"fp8": "Float8Linear.Config:AXISWISE", "fp8-rowwise": "Float8Linear.Config:AXISWISE",
                     "fp8-delayed": "Float8Linear.Config:AXISWISE", "mxfp8": "MXFP8Linear.Config"}
MEGATRON_RECIPE = {"fp8": "tensorwise", "fp8-delayed": "delayed", "mxfp8": "mxfp8", "fp8-rowwise": "blockwise"}


def _precision_cases(tmp_path):
    """The plans of PRECISION_PLANS read back from JSON files, as `autoplan export plans.json` reads them."""
    import json

    from autoplan.export.load import load_plan

    cases = []
    for i, (model, fields, batch, seq, gpu) in enumerate(PRECISION_PLANS):
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps({"plan": fields, "schema_version": 2}))
        plan = load_plan(str(path))
        assert plan.precision == fields["precision"]
        cases.append((model, plan, batch, seq, gpu))
    return cases


def test_low_precision_plans_load_in_torchtitan_with_their_linears_converted(torchtitan_load, tmp_path):
    cases = _precision_cases(tmp_path)
    requests = [(export(plan, "torchtitan", num_layers=_layers(model), global_batch=batch, seq=seq,
                        model=model).argv, plan.tp * plan.cp * plan.pp * plan.dp, gpu)
                for model, plan, batch, seq, gpu in cases]
    for (model, plan, batch, seq, _), loaded in zip(cases, torchtitan_load(requests)):
        check_torchtitan(plan, _layers(model), batch, seq, loaded)
        blocks = {fqn: kind for fqn, kind in loaded["linears"].items() if fqn.startswith("layers.")}
        assert len(blocks) == 5 * _layers(model)          # wqkv (fused in 0.3), wo, w1, w2, w3 per block
        assert set(blocks.values()) == {TORCHTITAN_LINEAR[plan.precision]}, plan.to_string()
        assert loaded["linears"]["lm_head"] == "Linear.Config"     # the head stays bf16, as priced


def test_a_bf16_plan_keeps_the_registry_config(torchtitan_load):
    plan = _parse("tp=2,dp=4")
    out = export(plan, "torchtitan", num_layers=32, global_batch=8, seq=2048, model="llama3-8b")
    (loaded,) = torchtitan_load([(out.argv, 8)])
    assert out.argv[:4] == ("--module", "llama3", "--config", "llama3_8b")
    assert set(loaded["linears"].values()) == {"Linear.Config"}


def test_low_precision_plans_pass_megatron_validate_args(megatron_rules, tmp_path):
    for model, plan, batch, seq, _ in _precision_cases(tmp_path):
        check_megatron(megatron_rules, plan, model, _layers(model), batch, seq)
        out = export(plan, "megatron", num_layers=_layers(model), global_batch=batch, seq=seq)
        argv = megatron_rules.command_words(out.text)
        assert argv[argv.index("--fp8-format") + 1] == "hybrid"
        assert argv[argv.index("--fp8-recipe") + 1] == MEGATRON_RECIPE[plan.precision]
        # FP8 parameter all-gathers where the plan prices them: FSDP2-style tensorwise at ZeRO-3
        assert ("--fp8-param-gather" in argv) == (plan.precision == "fp8" and plan.zero == 3)
        assert "--bf16" in argv


def test_the_validate_args_checker_refuses_fp8_misuse(megatron_rules):
    base = ["--num-layers", "4", "--tensor-model-parallel-size", "2", "--micro-batch-size", "1", "--bf16"]
    check = megatron_rules.check
    assert check(base + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], world_size=4) == []
    assert any("TC:587" in f for f in check(base + ["--fp8-recipe", "tensorwise"], world_size=4))
    assert any("A:1096" in f for f in check(base + ["--fp8-format", "hybrid", "--fp8-param-gather"], world_size=4))
    assert any("invalid choice" in f for f in check(base + ["--fp8-format", "hybrid", "--fp8-recipe", "rowwise"],
                                                    world_size=4))


@pytest.mark.parametrize("precision, warned", [("fp8", "tensorwise"), ("fp8-delayed", "delayed"),
                                               ("fp8-rowwise", None), ("mxfp8", None)])
def test_what_torchtitan_0_3_lacks_of_a_precision_is_warned(precision, warned):
    out = export(_parse(f"tp=2,dp=4,zero=3,precision={precision}"), "torchtitan", num_layers=32, model="llama3-8b")
    said = [w for w in out.warnings if w.startswith(f"precision={precision}")]
    assert bool(said) == bool(warned) and (not warned or warned in said[0])
    mega = export(_parse(f"tp=2,dp=4,zero=3,precision={precision}"), "megatron", num_layers=32)
    assert any(w.startswith("precision=fp8-rowwise") for w in mega.warnings) == (precision == "fp8-rowwise")
