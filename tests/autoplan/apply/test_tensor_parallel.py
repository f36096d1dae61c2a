"""Per-parameter tp placements: Megatron defaults from the probe, explicit mappings, validation."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from autoplan import zoo
from autoplan.apply.layout import probe
from autoplan.apply.tensor_parallel import parse_placement, resolve_placements
from autoplan.errors import UserError
from autoplan.zoo.spec import parse_spec

GPT = "gpt:layers=2,hidden=32,heads=4,vocab=64,dropout=0"
LLAMA = "llama:layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,ffn=64"


def _model(spec):
    torch.manual_seed(0)
    model = zoo.build(parse_spec(spec))
    return model, probe(model, torch.zeros(1, 8, dtype=torch.long))


def test_megatron_defaults_for_gpt():
    model, layout = _model(GPT)
    pl = resolve_placements(model, layout, 2, None)
    assert set(pl) == {n for n, _ in model.named_parameters()}
    assert pl["layers.0.attn.q_proj.weight"] == pl["layers.0.attn.q_proj.bias"] == "S(0)"
    assert pl["layers.0.attn.o_proj.weight"] == "S(1)" and pl["layers.0.attn.o_proj.bias"] == "R"
    assert pl["layers.1.mlp.up_proj.weight"] == "S(0)" and pl["layers.1.mlp.down_proj.weight"] == "S(1)"
    assert pl["layers.0.ln_1.weight"] == pl["ln_f.bias"] == "R"
    assert pl["wte.weight"] == pl["wpe.weight"] == "S(0)"                  # vocabulary-parallel


def test_megatron_defaults_for_llama_head_and_fallback_when_tp_does_not_divide():
    model, layout = _model(LLAMA)
    assert resolve_placements(model, layout, 2, None)["output.weight"] == "S(0)"
    pl3 = resolve_placements(model, layout, 3, None)                        # 32, 64, 16 not divisible by 3
    assert set(pl3.values()) == {"R"}


def test_experts_are_sharded_by_expert_when_tp_divides_the_local_experts():
    """The block ILP's choice for the zoo's MoE (``S(0)`` on the expert dim), so a bare plan runs
    the layout its estimate priced; under ep the local E/ep experts must divide by tp."""
    model, layout = _model("moe:layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,experts=4,topk=2,moe_ffn=32")
    experts = [n for n in dict(model.named_parameters()) if ".moe.routed." in n]
    assert len(experts) == 6
    assert {resolve_placements(model, layout, 2, None)[n] for n in experts} == {"S(0)"}
    assert {resolve_placements(model, layout, 2, None, ep=2)[n] for n in experts} == {"S(0)"}   # 2 local
    assert {resolve_placements(model, layout, 2, None, ep=4)[n] for n in experts} == {"R"}      # 1 local
    assert resolve_placements(model, layout, 2, None)["layers.0.moe.router.weight"] == "R"


def test_explicit_block_placements_apply_to_every_block_and_may_name_outside_parameters():
    model, layout = _model(GPT)
    given = {n: "R" for n in layout.block_params[0]}
    given["attn.q_proj.weight"] = "S(1)"
    given["wte.weight"] = "R"
    pl = resolve_placements(model, layout, 2, given)
    assert pl["layers.0.attn.q_proj.weight"] == pl["layers.1.attn.q_proj.weight"] == "S(1)"
    assert pl["layers.1.mlp.up_proj.weight"] == "R"
    assert pl["wte.weight"] == "R" and pl["wpe.weight"] == "S(0)"           # outside: default unless named
    by_block = resolve_placements(model, layout, 2, lambda i, block: {n: ("S(0)" if i else "R")
                                                                   for n in layout.block_params[i]})
    assert by_block["layers.0.mlp.up_proj.weight"] == "R" and by_block["layers.1.mlp.up_proj.weight"] == "S(0)"


def test_placements_missing_a_block_parameter_are_a_user_error():
    model, layout = _model(GPT)
    with pytest.raises(UserError, match="missing ln_1.weight, ln_1.bias, attn.q_proj.weight, attn.q_proj.bias, "
                                        "attn.v_proj.weight"):
        resolve_placements(model, layout, 2, {"attn.k_proj.weight": "S(0)"})


def test_a_missing_bias_follows_its_weight():
    model, layout = _model(GPT)
    given = {n: "R" for n in layout.block_params[0] if not n.endswith(".bias")}
    given["attn.q_proj.weight"] = "S(0)"
    pl = resolve_placements(model, layout, 2, given)
    assert pl["layers.0.attn.q_proj.bias"] == "S(0)" and pl["layers.0.ln_1.bias"] == "R"


@pytest.mark.parametrize("text, shape, expected", [
    ("R", (4, 6), Replicate()), ("S(0)", (4, 6), Shard(0)), ("S(1)", (4, 6), Shard(1)),
    (" S(-1) ", (4, 6), Shard(1)),
])
def test_parse_placement(text, shape, expected):
    assert parse_placement(text, torch.Size(shape), 2, "w") == expected


@pytest.mark.parametrize("text, shape, match", [
    ("P", (4, 6), "is not R or S"), ("S(2)", (4, 6), "names dim 2"), ("S(0)", (5, 6), "does not divide"),
])
def test_bad_placements_are_user_errors(text, shape, match):
    with pytest.raises(UserError, match=match):
        parse_placement(text, torch.Size(shape), 2, "w")
