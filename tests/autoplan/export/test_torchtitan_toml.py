"""Plan → torchtitan 0.2.x TOML (``--to torchtitan@0.2``): every mapping, every warning, and valid TOML."""
from __future__ import annotations

import pytest
import tomllib

from autoplan.export.torchtitan import model_parts
from autoplan.export.torchtitan_toml import to_torchtitan_toml
from autoplan.plan import Plan

GPT3 = "tp=8,pp=8,dp=16,vpp=3,schedule=interleaved,recompute=selective,sp=on,zero=1"


def _toml(plan, **kw):
    out = to_torchtitan_toml(Plan.parse(plan), **kw)
    return tomllib.loads(out.text), out.warnings


def test_gpt3_plan_maps_to_parallelism_keys():
    cfg, warnings = _toml(GPT3, num_layers=96, global_batch=1536, seq=2048)
    par = cfg["parallelism"]
    assert par["tensor_parallel_degree"] == 8 and par["pipeline_parallel_degree"] == 8
    assert par["data_parallel_shard_degree"] == 16 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 1
    assert par["context_parallel_degree"] == 1 and par["expert_parallel_degree"] == 1
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 24 and all(len([m for m in p if m.startswith("layers.")]) == 4 for p in parts)
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert cfg["training"] == {"local_batch_size": 96, "global_batch_size": 1536, "seq_len": 2048}
    assert warnings == ("zero=1 has no torchtitan form: FSDP with fsdp_reshard_after_forward = \"never\" "
                        "(zero=2: gradients sharded too)",
                        "recompute=selective (Megatron's attention-core recomputation) is not in torchtitan: its "
                        "selective activation checkpointing is per-op SAC (recompute=op: every second matmul "
                        "recomputed), slower than the plan's estimate, within its memory")


def test_model_parts_put_embedding_first_and_head_last():
    assert model_parts((1, 2)) == [["tok_embeddings", "layers.0"], ["layers.1", "layers.2", "norm", "lm_head"]]
    assert model_parts((1, 2), head="output")[1][-1] == "output"


@pytest.mark.parametrize("plan, keys", [
    ("dp=8,zero=0", {"data_parallel_replicate_degree": 8, "data_parallel_shard_degree": 1}),
    ("dp=8,zero=2", {"data_parallel_shard_degree": 8, "fsdp_reshard_after_forward": "never"}),
    ("dp=8,zero=3", {"data_parallel_shard_degree": 8, "fsdp_reshard_after_forward": "always"}),
    ("pp=4,schedule=zbv,dp=2,zero=3", {"pipeline_parallel_schedule": "ZBVZeroBubble"}),
    ("pp=4,schedule=dualpipev", {"pipeline_parallel_schedule": "DualPipeV"}),
    ("pp=4,schedule=gpipe,mbs=2", {"pipeline_parallel_schedule": "GPipe",
                                    "pipeline_parallel_microbatch_size": 2}),
    ("pp=4,schedule=zb-h1", {"pipeline_parallel_schedule": "InterleavedZeroBubble"}),
    ("cp=4,tp=2", {"context_parallel_degree": 4, "context_parallel_rotate_method": "alltoall"}),
    ("dp=8,ep=4,zero=3", {"expert_parallel_degree": 4}),
    ("tp=2,dp=8,ep=4,zero=3", {"expert_parallel_degree": 4, "expert_tensor_parallel_degree": 2}),
])
def test_mappings(plan, keys):
    cfg, warnings = _toml(plan, num_layers=8)
    for k, v in keys.items():
        assert cfg["parallelism"][k] == v
    assert warnings == ()


def test_uneven_stage_cuts_are_expressed_exactly():
    cfg, warnings = _toml("pp=2,layers=3-5", num_layers=8)
    parts = cfg["parallelism"]["module_fqns_per_model_part"]
    assert [len(p) for p in parts] == [4, 7] and parts[1][-2:] == ["norm", "output"]
    assert warnings == ()


def test_training_keys_without_pipeline_use_micro_batches_for_accumulation():
    cfg, _ = _toml("dp=4,mbs=2,zero=3", global_batch=64)
    assert cfg["training"] == {"local_batch_size": 2, "global_batch_size": 64}


@pytest.mark.parametrize("plan, warning", [
    ("tp=2,sp=off", "sp=off is not expressible"),
    ("pp=2,schedule=zb-h2", "schedule=zb-h2 is not in torch pipelining"),
    ("cp=2,cp_algo=ulysses", "cp_algo=ulysses is not in torchtitan"),
    ("cp=2,cp_algo=usp", "cp_algo=usp is not in torchtitan"),
    ("pp=2,recompute=full-none", "per-stage recompute full-none is not expressible: recompute=full"),
    ("tp=2,pp=2,order=pp-tp-cp-ep-dp", "order=pp-tp-cp-ep-dp is not expressible"),
    ("dp=2,zero=1", "zero=1 has no torchtitan form"),
    ("tp=2,recompute=selective", "recompute=selective (Megatron's attention-core recomputation) is not in torchtitan"),
])
def test_what_torchtitan_cannot_express_is_warned(plan, warning):
    _, warnings = _toml(plan, num_layers=8)
    assert any(w.startswith(warning) for w in warnings), warnings


def test_unknown_layer_count_leaves_cuts_to_torchtitan_with_a_warning():
    cfg, warnings = _toml("pp=4")
    assert "module_fqns_per_model_part" not in cfg["parallelism"]
    assert any("pass --model to pin them" in w for w in warnings)


def test_expert_tensor_parallelism_only_with_ep_and_tp():
    """etp = tp keeps the plan's experts split over tp; without ep or tp there is nothing to carry."""
    for plan in ("dp=8,ep=4,zero=3", "tp=2,dp=8,zero=3"):
        cfg, _ = _toml(plan)
        assert "expert_tensor_parallel_degree" not in cfg["parallelism"]


@pytest.mark.parametrize("precision, section, keys", [
    # 0.2.2's Float8Linear: no recipe = tensorwise dynamic scaling; FP8 all-gathers at zero 3, as priced
    ("fp8", "float8", {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
                       "precompute_float8_dynamic_scale_for_fsdp": True}),
    ("fp8-rowwise", "float8", {"filter_fqns": ["output"], "recipe_name": "rowwise"}),
    ("fp8-delayed", "float8", {"filter_fqns": ["output"]}),
    ("mxfp8", "mx", {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}),
])
def test_precision_maps_to_the_model_converter_and_its_quantize_section(precision, section, keys):
    cfg, warnings = _toml(f"tp=2,dp=4,zero=3,precision={precision}", num_layers=32)
    assert cfg["model"] == {"converters": [f"quantize.linear.{section}"]}
    assert cfg["quantize"]["linear"] == {section: keys}
    assert any(w.startswith("precision=fp8-delayed") for w in warnings) == (precision == "fp8-delayed")


def test_fp8_gathers_only_where_the_plan_prices_them_and_bf16_has_no_converter():
    cfg, _ = _toml("tp=2,dp=4,zero=2,precision=fp8", num_layers=32)
    assert cfg["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"]}      # zero 2 gathers in bf16
    cfg, _ = _toml("tp=2,dp=4,zero=3", num_layers=32)
    assert "model" not in cfg and "quantize" not in cfg
