"""Plan → Megatron-LM arguments: every mapping and every warning."""
from __future__ import annotations

import shlex

import pytest

from autoplan.export.megatron import pipeline_layout, to_megatron
from autoplan.plan import Plan

GPT3 = "tp=8,pp=8,dp=16,vpp=3,schedule=interleaved,recompute=selective,sp=on,zero=1"


def _args(plan, **kw):
    out = to_megatron(Plan.parse(plan), **kw)
    body = [line for line in out.text.splitlines() if not line.startswith("#")]
    return shlex.split(" ".join(line.rstrip("\\") for line in body)), out.warnings


def _flag(args, name):
    return args[args.index(name) + 1]


def test_gpt3_plan_maps_to_megatron_flags():
    args, warnings = _args(GPT3, num_layers=96, global_batch=1536, seq=2048)
    assert _flag(args, "--tensor-model-parallel-size") == "8"
    assert _flag(args, "--pipeline-model-parallel-size") == "8"
    assert _flag(args, "--num-layers-per-virtual-pipeline-stage") == "4"
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args
    assert _flag(args, "--recompute-granularity") == "selective" and "--recompute-method" not in args
    assert _flag(args, "--micro-batch-size") == "1" and _flag(args, "--global-batch-size") == "1536"
    assert _flag(args, "--num-layers") == "96" and _flag(args, "--seq-length") == "2048"
    assert "--context-parallel-size" not in args and "--use-tp-pp-dp-mapping" not in args
    assert warnings == ()


def test_uneven_cuts_use_the_pipeline_layout():
    assert pipeline_layout((2, 3, 1)) == "Ett|ttt|tL"
    args, _ = _args("pp=2,vpp=2,schedule=interleaved,layers=1-2-2-1", num_layers=6)
    assert _flag(args, "--pipeline-model-parallel-layout") == "Et|tt|tt|tL"
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_embedding_only_and_head_only_chunks_export_as_megatrons_layout():
    """Llama 3's layout: the first chunk only the embedding, the last only the head and loss."""
    args, _ = _args("pp=2,vpp=2,schedule=interleaved,layers=0-1-1-0", num_layers=2)
    assert _flag(args, "--pipeline-model-parallel-layout") == "E|t|t|L"


def test_virtual_stages_without_a_layer_count():
    args, _ = _args("pp=4,vpp=2,schedule=interleaved")
    assert _flag(args, "--num-virtual-stages-per-pipeline-rank") == "2"


@pytest.mark.parametrize("plan, flags", [
    ("dp=8,zero=0", {}),
    ("dp=8,zero=2", {"--use-megatron-fsdp": None, "--data-parallel-sharding-strategy": "optim_grads"}),
    ("dp=8,zero=3", {"--use-megatron-fsdp": None, "--data-parallel-sharding-strategy": "optim_grads_params"}),
    ("cp=4,dp=2", {"--context-parallel-size": "4", "--cp-comm-type": "p2p"}),
    ("cp=4,cp_algo=ulysses", {"--cp-comm-type": "a2a"}),
    ("dp=8,ep=4", {"--expert-model-parallel-size": "4"}),
    ("tp=2,recompute=full", {"--recompute-granularity": "full", "--recompute-method": "uniform",
                             "--recompute-num-layers": "1"}),
    ("tp=2,pp=2,order=tp-cp-ep-pp-dp", {"--use-tp-pp-dp-mapping": None}),
    ("tp=2,sp=off", {}),
])
def test_mappings(plan, flags):
    args, warnings = _args(plan, num_layers=8)
    for flag, value in flags.items():
        assert flag in args
        if value is not None:
            assert _flag(args, flag) == value
    if plan == "dp=8,zero=0":
        assert "--use-distributed-optimizer" not in args and "--use-megatron-fsdp" not in args
    if plan == "tp=2,sp=off":
        assert "--sequence-parallel" not in args
    assert warnings == ()


@pytest.mark.parametrize("plan, warning", [
    ("pp=2,schedule=gpipe", "schedule=gpipe is not in Megatron-LM"),
    ("pp=2,schedule=zb-h1", "schedule=zb-h1 is not in Megatron-LM"),
    ("pp=2,schedule=zbv", "schedule=zbv (V placement) is not in Megatron-LM"),
    ("pp=2,schedule=dualpipev", "schedule=dualpipev (V placement) is not in Megatron-LM"),
    ("cp=2,cp_algo=usp", "cp_algo=usp split 2×1 (Ulysses × ring) for 8-GPU NVLink domains"),
    ("pp=4,recompute=full-selective-none-none", "per-stage recompute full-selective-none-none"),
    ("tp=2,order=pp-tp-cp-ep-dp", "order=pp-tp-cp-ep-dp is not expressible"),
])
def test_what_megatron_cannot_express_is_warned(plan, warning):
    _, warnings = _args(plan, num_layers=8)
    assert any(w.startswith(warning) for w in warnings), warnings


def test_v_schedule_keeps_two_chunks_per_rank():
    args, _ = _args("pp=2,schedule=zbv", num_layers=8)
    assert _flag(args, "--num-layers-per-virtual-pipeline-stage") == "2"


@pytest.mark.parametrize("plan, flags", [
    ("dp=8,zero=2", {"--ckpt-format": "fsdp_dtensor"}),
    ("dp=8,zero=3", {"--ckpt-format": "fsdp_dtensor"}),
    ("tp=2,dp=8,ep=4", {"--expert-model-parallel-size": "4", "--expert-tensor-parallel-size": "2",
                        "--moe-token-dispatcher-type": "alltoall"}),
    ("tp=2,cp=8,cp_algo=usp", {"--cp-comm-type": "a2a+p2p", "--hierarchical-context-parallel-sizes": "4"}),
])
def test_flags_megatron_requires_with_the_plan(plan, flags):
    args, _ = _args(plan, num_layers=8)
    assert "--bf16" in args
    for flag, value in flags.items():
        assert _flag(args, flag) == value


def test_usp_split_is_autoplans_rule_for_the_clusters_nvlink_domain():
    """tp=2 beside cp=8 on 8-GPU domains: Ulysses over 4, ring over 2; 72-GPU domains: Ulysses over 8."""
    args, _ = _args("tp=2,cp=8,cp_algo=usp", num_layers=8)
    assert args[args.index("--hierarchical-context-parallel-sizes") + 1:][:2] == ["4", "2"]
    args, warnings = _args("tp=2,cp=8,cp_algo=usp", num_layers=8, nvlink_domain=72)
    assert args[args.index("--hierarchical-context-parallel-sizes") + 1:][:2] == ["8", "1"] and warnings == ()


def test_usp_split_written_in_the_plan_is_exported_as_written():
    """USP paper's u2r8 on 16 ranks: the plan's split, not the rule's 8×2, and no domain warning."""
    args, warnings = _args("cp=16,ulysses=2", num_layers=8)
    assert args[args.index("--hierarchical-context-parallel-sizes") + 1:][:2] == ["2", "8"] and warnings == ()


def test_v_schedule_cut_is_listed_rank_by_rank():
    """A V's rank r holds stages r and 2·pp−1−r; Megatron's layout entry v·pp + r is rank r's chunk v."""
    args, warnings = _args("pp=2,schedule=zbv,layers=1-3-2-4", num_layers=10)
    assert _flag(args, "--pipeline-model-parallel-layout") == "Et|ttt|tttt|ttL"
    assert any("places the output layer and loss on pipeline rank 1" in w for w in warnings)
    args, _ = _args("pp=2,vpp=2,schedule=interleaved,layers=1-3-2-4", num_layers=10)
    assert _flag(args, "--pipeline-model-parallel-layout") == "Et|ttt|tt|ttttL"


@pytest.mark.parametrize("plan, overlap", [
    ("pp=2,dp=8,ep=4,schedule=zbv", True),
    ("pp=2,dp=8,ep=4,schedule=dualpipev,recompute=selective", True),
    ("pp=2,dp=8,ep=4,schedule=dualpipev,recompute=full", False),
    ("pp=2,dp=8,ep=4,schedule=zb-h1", False),
    ("pp=2,dp=8,schedule=zbv", False),
    ("pp=2,dp=8,ep=4,vpp=2,schedule=interleaved", False),
])
def test_w_split_uses_megatrons_moe_overlap_where_its_preconditions_hold(plan, overlap):
    args, warnings = _args(plan, num_layers=8)
    assert ("--delay-wgrad-compute" in args) == overlap
    assert ("--overlap-moe-expert-parallel-comm" in args) == overlap
    split = Plan.parse(plan).schedule_spec.split_backward
    assert any("weight-gradient split has no Megatron-LM form" in w for w in warnings) == (split and not overlap)


@pytest.mark.parametrize("plan, flags", [
    ("tp=2,dp=8,ep=4", {"--moe-token-dispatcher-type": "alltoall"}),
    ("tp=2,dp=8,ep=4,dispatcher=deepep", {"--moe-token-dispatcher-type": "flex",
                                          "--moe-flex-dispatcher-backend": "deepep"}),
])
def test_dispatcher_the_plan_prices_is_the_one_megatron_runs(plan, flags):
    args, _ = _args(plan, num_layers=8)
    assert {flag: _flag(args, flag) for flag in flags} == flags
    assert ("--moe-flex-dispatcher-backend" in args) == ("deepep" in plan)


@pytest.mark.parametrize("plan, overlap, warned", [
    ("dp=8,ep=8,ep_overlap=on", True, False),                                  # pp = 1: always allowed
    ("pp=2,vpp=2,dp=8,ep=4,schedule=interleaved,ep_overlap=on", True, False),
    ("dp=8,ep=8,ep_overlap=on,recompute=full", False, True),                   # TransformerConfig refuses
    ("dp=8,ep=8,ep_overlap=on,recompute=op", False, True),                     # op runs as full
    ("dp=8,ep=8", False, False),
])
def test_ep_overlap_becomes_megatrons_combined_1f1b_overlap(plan, overlap, warned):
    args, warnings = _args(plan, num_layers=8)
    assert ("--overlap-moe-expert-parallel-comm" in args) == overlap
    assert args.count("--overlap-moe-expert-parallel-comm") <= 1 and "--delay-wgrad-compute" not in args
    assert any(w.startswith("ep_overlap=on (priced") for w in warnings) == warned


def test_zero_bubble_moe_plan_with_ep_overlap_writes_the_overlap_once():
    args, _ = _args("pp=2,vpp=2,dp=8,ep=4,schedule=interleaved,ep_overlap=on", num_layers=8)
    assert args.count("--overlap-moe-expert-parallel-comm") == 1
    args, _ = _args("pp=2,dp=8,ep=4,schedule=zbv", num_layers=8)
    assert args.count("--overlap-moe-expert-parallel-comm") == 1 and "--delay-wgrad-compute" in args
