"""Family spec strings → configs; bad specs are UserErrors that list the valid keys."""
from __future__ import annotations

import pytest

from autoplan.errors import UserError
from autoplan.zoo.gpt import GPTConfig
from autoplan.zoo.llama import LlamaConfig
from autoplan.zoo.moe import MoEConfig
from autoplan.zoo.spec import parse_spec


def test_family_defaults():
    gpt = parse_spec("gpt:layers=96,hidden=12288,heads=96,vocab=51200")
    assert isinstance(gpt, GPTConfig)
    assert (gpt.mlp, gpt.norm, gpt.tie, gpt.d_ffn) == ("gelu", "layernorm", True, 4 * 12288)
    llama = parse_spec("llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256")
    assert isinstance(llama, LlamaConfig)
    assert (llama.mlp, llama.norm, llama.tie, llama.n_kv_heads) == ("swiglu", "rmsnorm", False, 8)
    moe = parse_spec("moe:layers=4,hidden=64,heads=4,kv_heads=2,vocab=100,experts=8,topk=2,moe_ffn=32,"
                     "dense_layers=1,shared_experts=1")
    assert isinstance(moe, MoEConfig)
    assert (moe.experts, moe.topk, moe.d_moe_ffn, moe.dense_layers, moe.shared_experts) == (8, 2, 32, 1, 1)


def test_overrides():
    cfg = parse_spec("gpt:layers=2,hidden=64,heads=4,vocab=100,mlp=swiglu,norm=rmsnorm,tie=false,ffn=96")
    assert (cfg.mlp, cfg.norm, cfg.tie, cfg.d_ffn) == ("swiglu", "rmsnorm", False, 96)


@pytest.mark.parametrize("spec, words", [
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,colour=red", ["unknown key 'colour'", "valid keys", "kv_heads"]),
    ("gpt:layers=2,hidden=64,heads=4", ["missing key(s) vocab", "valid keys"]),
    ("llama:layers=2,hidden=64,heads=4,vocab=100,experts=8", ["unknown key 'experts'", "valid keys"]),
    ("gpt:layers=two,hidden=64,heads=4,vocab=100", ["layers must be an integer", "valid keys"]),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,mlp=tanh", ["mlp is one of"]),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,tie=maybe", ["tie is true or false"]),
    ("gpt:layers=2,hidden=65,heads=4,vocab=100", ["not a multiple of heads"]),
    ("moe:layers=2,hidden=64,heads=4,vocab=100,experts=4,topk=5", ["topk"]),
    ("gpt:layers=0,hidden=64,heads=4,vocab=100", ["must be positive"]),
    ("gpt:layers=1000000000,hidden=64,heads=4,vocab=100", ["layers=", "layers is at most 1,024"]),
    ("llama:layers=99999999999999,hidden=64,heads=4,vocab=100", ["layers is at most 1,024"]),
    ("moe:layers=2,hidden=64,heads=4,vocab=100,dense_layers=5000", ["dense_layers is at most 1,024"]),
    ("gpt:layers=2,hidden=1099511627776,heads=4,vocab=100", ["hidden is at most 131,072"]),
    ("moe:layers=2,hidden=64,heads=4,vocab=100,experts=100000000000,topk=2", ["experts is at most 16,384"]),
    ("gpt:layers=2,hidden=64,heads=4,vocab=99999999999999", ["vocab is at most 16,777,216"]),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,dropout=nan", ["dropout must be a finite number in [0, 1)"]),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,dropout=1", ["dropout must be a finite number in [0, 1)"]),
    ("moe:layers=2,hidden=64,heads=4,vocab=100,capacity_factor=inf", ["capacity_factor must be a finite"]),
    ("moe:layers=2,hidden=64,heads=4,vocab=100,capacity_factor=0", ["above 0"]),
])
def test_bad_specs(spec, words):
    """Every bad spec names the key and the rule (and, for sizes, the bound)."""
    with pytest.raises(UserError) as err:
        parse_spec(spec)
    for w in words:
        assert w in str(err.value)


def test_sizes_at_the_bounds_parse():
    cfg = parse_spec("moe:layers=1024,hidden=64,heads=4,vocab=16777216,experts=16384,topk=2,capacity_factor=1023.5")
    assert (cfg.layers, cfg.vocab, cfg.experts, cfg.capacity_factor) == (1024, 2 ** 24, 2 ** 14, 1023.5)


def test_group_limited_routing_draws_a_tokens_experts_from_its_best_groups():
    """DeepSeek-V3's router: groups score their best expert's logit, a token's top-k comes from its
    ``topk_groups`` best groups (the spec keys ``groups`` and ``topk_groups``; ModelInfo's
    ``expert_groups``/``topk_groups`` feed the dispatch's node count)."""
    import torch

    from autoplan.zoo import ZOO, model_info
    from autoplan.zoo.moe import MoE, MoEConfig

    cfg = MoEConfig(layers=1, hidden=16, heads=2, vocab=32, experts=8, topk=3, moe_ffn=8, groups=4, topk_groups=2)
    moe = MoE(cfg)
    logits = torch.randn(64, 8)
    ids = moe.limit_groups(logits).topk(3, dim=-1).indices
    assert all(len({int(i) // 2 for i in row}) <= 2 for row in ids)
    info = model_info("deepseek-v3", ZOO["deepseek-v3"])
    assert (info.expert_groups, info.topk_groups) == (8, 4)
    with pytest.raises(UserError, match="groups"):
        parse_spec("moe:layers=2,hidden=64,heads=4,vocab=64,experts=8,topk=2,groups=3,topk_groups=1")
