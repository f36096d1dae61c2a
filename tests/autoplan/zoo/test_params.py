"""Zoo parameter counts against published sizes (models built on the meta device: no memory)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from autoplan import zoo


def param_count(cfg, *, mtp: bool = True) -> int:
    with torch.device("meta"):
        model = zoo.build(cfg)
    return sum(p.numel() for name, p in model.named_parameters() if mtp or not name.startswith("mtp."))


@pytest.mark.parametrize("name", sorted(zoo.PUBLISHED_PARAMS_B))
def test_published_sizes(name):
    """Published sizes count the main model: DeepSeek-V3's 671 B leaves out its MTP module."""
    got = param_count(zoo.ZOO[name], mtp=False) / 1e9
    assert got == pytest.approx(zoo.PUBLISHED_PARAMS_B[name], rel=0.005)


def test_deepseek_v3_mtp_module_size():
    """One MTP module: an MoE layer (MLA + router + 256 experts + 1 shared), the 2h → h projection and three
    RMSNorms; with the embedding and head copies HF's checkpoint stores for it, 685 B (the model card's size)."""
    h, e, f = 7168, 256, 2048
    layer = 187_107_328 + e * h + e * 3 * h * f + 3 * h * f + 2 * h
    mtp = layer + 2 * h * h + 3 * h
    cfg = zoo.ZOO["deepseek-v3"]
    assert cfg.mtp_layers == 1
    assert param_count(cfg) - param_count(cfg, mtp=False) == mtp
    assert (param_count(cfg) + 2 * 129280 * h) / 1e9 == pytest.approx(685, rel=0.005)


# Narayanan et al. 2021, Table 1: params (B) as published.
SC21_TABLE1 = {"gpt-1.7b": 1.7, "gpt-3.6b": 3.6, "gpt-7.5b": 7.5, "gpt-18.4b": 18.4, "gpt-39.1b": 39.1,
               "gpt-76.1b": 76.1, "gpt-145.6b": 145.6, "gpt-310.1b": 310.1, "gpt-529.6b": 529.6,
               "gpt-1t": 1008.0}


@pytest.mark.parametrize("name", sorted(SC21_TABLE1))
def test_sc21_table1_sizes_match_eq2(name):
    cfg = zoo.ZOO[name]
    l, h, V, s = cfg.layers, cfg.hidden, cfg.vocab, cfg.max_seq
    eq2 = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    got = param_count(cfg)
    assert got == pytest.approx(eq2, rel=0.005)
    published = SC21_TABLE1[name]          # the table rounds to 0.1 B
    assert abs(got / 1e9 - published) <= max(0.05, 0.005 * published)


def test_sc21_table1_shapes():
    assert (zoo.ZOO["gpt-145.6b"].heads, zoo.ZOO["gpt-145.6b"].hidden, zoo.ZOO["gpt-145.6b"].layers) == (96, 12288, 80)
    assert zoo.ZOO["gpt-22b"].hidden == 6144 and zoo.ZOO["gpt-22b"].heads == 64 and zoo.ZOO["gpt-22b"].layers == 48
    assert all(zoo.ZOO[n].vocab == 51200 and zoo.ZOO[n].tie for n in SC21_TABLE1)


def test_deepseek_v3_shape_and_note():
    cfg = zoo.ZOO["deepseek-v3"]
    assert (cfg.layers, cfg.hidden, cfg.experts, cfg.topk, cfg.shared_experts, cfg.moe_ffn,
            cfg.dense_layers, cfg.ffn, cfg.vocab) == (61, 7168, 256, 8, 1, 2048, 3, 18432, 129280)
    info = zoo.model_info("deepseek-v3", cfg)
    assert info.notes == (zoo.DEEPSEEK_NOTE,) and "sigmoid" in zoo.DEEPSEEK_NOTE
    assert (info.heads, info.kv_heads, info.head_dim, info.v_head_dim, info.kv_lora_rank, info.q_lora_rank,
            info.qk_rope_dim) == (128, 128, 192, 128, 512, 1536, 64)
    # MLA's attention parameters by hand: q_a, q_a norm, q_b (192-dim heads), kv_a (512 latent + 64 rope),
    # kv norm, kv_b (128 nope + 128 v per head), o_proj
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    with torch.device("meta"):
        model = zoo.build(cfg)
    assert {sum(p.numel() for p in layer.attention.parameters()) for layer in model.layers} == {mla}
    assert mla == 187_107_328


def test_mla_matches_transformers_deepseek_v3():
    """The zoo's MLA is HF DeepSeek-V3's attention, parameter shape for parameter shape."""
    transformers = pytest.importorskip("transformers")
    path = Path(__file__).parents[1] / "frontend" / "models" / "real" / "deepseek_v3.py"
    spec = importlib.util.spec_from_file_location("real_deepseek_v3", path)   # by path: no package import
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    config = real.config

    with torch.device("meta"):
        theirs = transformers.DeepseekV3ForCausalLM(config(1)).model.layers[0].self_attn
        ours = zoo.build(zoo.ZOO["deepseek-v3"]).layers[0].attention
    assert (sorted(tuple(p.shape) for p in ours.parameters())
            == sorted(tuple(p.shape) for p in theirs.parameters()))


def test_model_info_from_config():
    info = zoo.model_info("llama3-70b", zoo.ZOO["llama3-70b"])
    assert (info.family, info.layers, info.hidden, info.heads, info.kv_heads, info.head_dim, info.ffn,
            info.vocab, info.tied_embeddings) == ("llama", 80, 8192, 64, 8, 128, 28672, 128256, False)
    moe = zoo.model_info("mixtral-8x7b", zoo.ZOO["mixtral-8x7b"])
    assert (moe.family, moe.experts, moe.topk, moe.moe_ffn) == ("moe", 8, 2, 14336)
