"""Plan → torchtitan 0.3.0 arguments: every mapping and every warning, without torchtitan installed
(test_engines_accept.py loads them in torchtitan's own config loader)."""
from __future__ import annotations

import pytest

from autoplan.export.torchtitan import model_parts, to_torchtitan
from autoplan.plan import Plan


def _argv(plan, **kw):
    out = to_torchtitan(Plan.parse(plan), **kw)
    return list(out.argv), out.warnings


def _value(argv, name):
    return argv[argv.index(f"--parallelism.{name}") + 1]


def test_every_parallelism_value_is_explicit():
    """The registry functions set their own degrees (llama3_405b: tp=8), so none is left to them."""
    argv, _ = _argv("dp=8,zero=3", model="llama3-405b")
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                "context_parallel_degree", "expert_parallel_degree", "fsdp_reshard_after_forward"):
        assert f"--parallelism.{key}" in argv
    assert _value(argv, "tensor_parallel_degree") == "1" and argv[-1] == "activation_checkpoint:none"


def test_model_picks_the_registry_config_and_others_get_a_stand_in_with_a_warning():
    argv, warnings = _argv("dp=8,zero=3", model="deepseek-v3")
    assert argv[:4] == ["--module", "deepseek_v3", "--config", "deepseek_v3_671b"] and warnings == ()
    argv, warnings = _argv("dp=8", model="gpt3-175b")
    assert argv[:4] == ["--module", "llama3", "--config", "llama3_debugmodel"]
    assert warnings[0].startswith("torchtitan 0.3.0 ships no config for gpt3-175b")
    _, warnings = _argv("dp=8", model="llama3-405b")
    assert "float8" in warnings[0]


@pytest.mark.parametrize("plan, values", [
    ("dp=8,zero=0", {"data_parallel_replicate_degree": "8", "data_parallel_shard_degree": "1"}),
    ("dp=8,zero=2", {"data_parallel_shard_degree": "8", "fsdp_reshard_after_forward": "never"}),
    ("dp=8,zero=3", {"data_parallel_shard_degree": "8", "fsdp_reshard_after_forward": "always"}),
    ("pp=4,schedule=zbv", {"pipeline_parallel_schedule": "ZBVZeroBubble"}),
    ("pp=4,schedule=dualpipev,mbs=2", {"pipeline_parallel_schedule": "DualPipeV",
                                       "pipeline_parallel_microbatch_size": "2"}),
    ("cp=4,tp=2", {"context_parallel_degree": "4", "tensor_parallel_degree": "2"}),
    ("dp=8,ep=4,zero=3", {"expert_parallel_degree": "4"}),
])
def test_mappings(plan, values):
    argv, _ = _argv(plan, num_layers=8, model="llama3-8b")
    for name, value in values.items():
        assert _value(argv, name) == value


def test_sequence_parallel_follows_the_plan():
    assert "--parallelism.no_enable_sequence_parallel" in _argv("tp=2,sp=off")[0]
    assert "--parallelism.enable_sequence_parallel" in _argv("tp=2")[0]


def test_pipeline_cuts_cuda_graphs_and_batches():
    argv, warnings = _argv("pp=2,dp=4,layers=3-5,mbs=2", num_layers=8, global_batch=64, seq=4096, model="llama3-8b")
    i = argv.index("--parallelism.module_fqns_per_model_part")
    assert argv[i + 1:i + 3] == [",".join(p) for p in model_parts((3, 5))]
    assert "--training.disable_cuda_graphs" in argv
    assert argv[argv.index("--training.local_batch_size") + 1] == "16"       # 64 / dp: all micro-batches
    assert argv[argv.index("--training.seq_len") + 1] == "4096"
    assert "--training.disable_cuda_graphs" not in _argv("dp=4")[0]


def test_experts_split_over_tp_keep_their_per_gpu_share_and_say_so():
    argv, warnings = _argv("tp=2,dp=8,ep=4,zero=1", model="deepseek-v3")
    assert _value(argv, "expert_parallel_degree") == "8"
    assert any(w.startswith("ep=4 with tp=2 (experts split over tp) is not in torchtitan 0.3.0") for w in warnings)


@pytest.mark.parametrize("plan, subcommand", [
    ("tp=2", "none"), ("tp=2,recompute=full", "full"), ("tp=2,recompute=op", "selective"),
    ("tp=2,recompute=selective", "selective"), ("tp=2,recompute=full:2", "full"),
    ("pp=2,recompute=none-op", "selective"), ("tp=2,recompute=op:2", "selective"),
])
def test_recompute_is_the_last_argument(plan, subcommand):
    assert _argv(plan, model="llama3-8b")[0][-1] == f"activation_checkpoint:{subcommand}"


@pytest.mark.parametrize("plan, warning", [
    ("tp=2,recompute=selective", "recompute=selective (Megatron's attention-core recomputation) is not in torchtitan"),
    ("tp=2,recompute=full:2", "recompute=full:2 (the first N layers of each stage) is not in torchtitan"),
    ("pp=2,recompute=full-none", "per-stage recompute full-none is not expressible"),
    ("tp=2,recompute=op:2", "recompute=op:2 (op on the first 2 layers of each stage) is not expressible"),
    ("pp=2,schedule=zb-h2", "schedule=zb-h2 is not in torch pipelining"),
    ("cp=2,cp_algo=ulysses", "cp_algo=ulysses is not in torchtitan 0.3.0"),
    ("dp=2,zero=1", "zero=1 has no torchtitan form"),
    ("dp=4,ep=2,zero=0", "zero=0 with ep > 1 has no torchtitan form"),
    ("tp=2,pp=2,order=pp-tp-cp-ep-dp", "order=pp-tp-cp-ep-dp is not expressible"),
])
def test_what_torchtitan_cannot_express_is_warned(plan, warning):
    _, warnings = _argv(plan, num_layers=8, model="llama3-8b")
    assert any(w.startswith(warning) for w in warnings), warnings


def test_unknown_layer_count_leaves_cuts_to_torchtitan_with_a_warning():
    argv, warnings = _argv("pp=4", model="llama3-8b")
    assert "--parallelism.module_fqns_per_model_part" not in argv
    assert any("pass --model to pin them" in w for w in warnings)


@pytest.mark.parametrize("plan, warned", [
    ("dp=8,ep=4,zero=3", ()),
    ("dp=8,ep=4,zero=3,dispatcher=deepep", ("dispatcher=deepep is chosen in Python",)),
    ("dp=8,ep=4,zero=3,dispatcher=deepep,ep_overlap=on",
     ("dispatcher=deepep is chosen in Python", "ep_overlap=on (combined 1F1B) is not in torchtitan")),
])
def test_moe_transfers_torchtitan_cannot_run_from_its_cli_are_warned(plan, warned):
    argv, warnings = _argv(plan, model="deepseek-v3")
    assert _value(argv, "expert_parallel_degree") == "4"
    prefixes = ("dispatcher=deepep is chosen in Python", "ep_overlap=on (combined 1F1B) is not in torchtitan")
    assert tuple(p for p in prefixes if any(w.startswith(p) for w in warnings)) == warned
