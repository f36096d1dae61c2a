"""Multi-head latent attention (``zoo.mla``): against transformers' DeepSeek-V3 attention, traced FLOPs
against a hand count, spec validation, and the MLA model arguments an export writes."""
from __future__ import annotations

import pytest
import torch

from autoplan import zoo
from autoplan.errors import UserError
from autoplan.export import Architecture, to_megatron
from autoplan.frontend import trace
from autoplan.plan import Plan
from autoplan.zoo.spec import parse_spec

SMALL = ("llama:layers=2,hidden=64,heads=4,vocab=128,head_dim=16,kv_lora_rank=16,q_lora_rank=24,qk_rope_dim=8,"
         "v_head_dim=12")
DEEPSEEK_ATTENTION = ("layers=1,hidden=7168,heads=128,head_dim=128,kv_lora_rank=512,q_lora_rank=1536,"
                      "qk_rope_dim=64,v_head_dim=128")


def _copy_into_transformers(ours, theirs) -> None:
    names = {"q_a_proj": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b_proj": "q_b_proj",
             "kv_a_proj": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b_proj": "kv_b_proj",
             "o_proj": "o_proj"}
    with torch.no_grad():
        for mine, hf in names.items():
            getattr(theirs, hf).weight.copy_(getattr(ours, mine).weight)


def test_mla_equals_transformers_deepseek_v3_attention():
    """Same weights, same input: the zoo's MLA and transformers' DeepseekV3Attention (rotate-half
    RoPE on the rotary slice, softmax scale 1/√(nope + rope)) give the same output."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    torch.manual_seed(0)
    cfg = parse_spec(SMALL)
    ours = zoo.build(cfg).layers[0].attention.eval()
    config = transformers.DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                           q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                           v_head_dim=12, rope_interleave=False, attention_bias=False,
                                           attn_implementation="eager", rope_theta=cfg.rope_theta)
    theirs = hf.DeepseekV3Attention(config, layer_idx=0).eval()
    _copy_into_transformers(ours, theirs)
    x = torch.randn(2, 10, 64)
    cos, sin = hf.DeepseekV3RotaryEmbedding(config)(x, torch.arange(10)[None])
    mask = torch.full((10, 10), float("-inf")).triu(1)[None, None]
    expected = theirs(x, (cos, sin), mask)[0]
    from autoplan.zoo.common import rope_cos_sin
    got = ours(x, *rope_cos_sin(10, 8, cfg.rope_theta, x.device, x.dtype))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_eager_and_sdpa_mla_agree_and_are_causal():
    torch.manual_seed(0)
    flash, eager = zoo.build(parse_spec(SMALL)), zoo.build(parse_spec(SMALL + ",attention=eager"))
    eager.load_state_dict(flash.state_dict())
    ids = torch.randint(0, 128, (2, 12))
    torch.testing.assert_close(flash(ids), eager(ids), rtol=1e-4, atol=1e-5)
    changed = ids.clone()
    changed[:, 8:] = (ids[:, 8:] + 1) % 128
    torch.testing.assert_close(flash(changed)[:, :8], flash(ids)[:, :8])


def mla_flops_per_token(h: int, a: int, q_r: int, kv_r: int, n: int, r: int, v: int, s: int) -> float:
    """Training FLOPs per token of one MLA layer as a GPU trace counts them (fwd + bwd):

    * projections q_a (h·q_r), q_b (q_r·a·(n+r)), kv_a (h·(kv_r+r)), kv_b (kv_r·a·(n+v)), o (a·v·h):
      2 FLOPs a weight forward, 4 backward (input and weight gradients): 6·weights;
    * attention over s keys (full s², torch's convention), q/k head d = n + r, v head v:
      forward q·kᵀ 2·s·a·d and p·v 2·s·a·v; the memory-efficient backward recomputes q·kᵀ and forms
      dP (2·s·a·v), dV (2·s·a·v), dQ and dK (2·s·a·d each): 2·s·a·(4·d + 3·v) in all."""
    weights = h * q_r + q_r * a * (n + r) + h * (kv_r + r) + kv_r * a * (n + v) + a * v * h
    return 6 * weights + 2 * s * a * (4 * (n + r) + 3 * v)


def test_traced_mla_flops_match_hand_count():
    seq, ffn = 1024, 18432
    g = trace(f"llama:{DEEPSEEK_ATTENTION},ffn={ffn},vocab=1024", seq=seq)
    block = g.blocks[0]
    assert "efficient attention" in block.description      # q/k 192 ≠ v 128: not the flash kernel
    swiglu = 6 * 3 * 7168 * ffn
    expected = mla_flops_per_token(7168, 128, 1536, 512, 128, 64, 128, seq) + swiglu
    assert block.graph.flops() / seq == pytest.approx(expected, rel=1e-3)     # pointwise ops: < 0.1 %
    assert block.graph.param_count == 187_107_328 + 3 * 7168 * ffn + 2 * 7168


@pytest.mark.parametrize("extra, problem", [
    (",qk_rope_dim=7", "qk_rope_dim=7"), (",qk_rope_dim=0", "qk_rope_dim=0"), (",kv_heads=2", "kv_heads=2")])
def test_bad_mla_specs_are_refused(extra, problem):
    with pytest.raises(UserError, match=problem):
        parse_spec(SMALL + extra)


def test_deepseek_v3_megatron_export_has_mla_arguments():
    arch = Architecture.of(zoo.model_info("deepseek-v3", zoo.ZOO["deepseek-v3"]))
    text = to_megatron(Plan.parse("tp=8,pp=8,dp=32,ep=64,etp=1"), num_layers=61, arch=arch).text
    words = text.replace("\\\n", " ").split()
    flags = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    assert "--multi-latent-attention" in words
    assert {k: flags[k] for k in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                                  "--v-head-dim")} == {"--q-lora-rank": "1536", "--kv-lora-rank": "512",
                                                       "--qk-head-dim": "128", "--qk-pos-emb-head-dim": "64",
                                                       "--v-head-dim": "128"}
    assert flags["--mtp-num-layers"] == "1"                 # DeepSeek-V3's one MTP module
    assert "--multi-latent-attention" not in to_megatron(Plan.parse("tp=8"), num_layers=80).text
    uneven = to_megatron(Plan.parse("pp=4,dp=2,ep=2,layers=16-16-16-13"), num_layers=61, arch=arch).text
    assert '"Et' in uneven and 'tttmL"' in uneven          # the MTP layer with the loss on the last stage


MLA_MOE = ("moe:layers=3,hidden=64,heads=4,vocab=256,experts=4,topk=2,moe_ffn=64,dense_layers=1,head_dim=16,"
           "kv_lora_rank=16,q_lora_rank=24,qk_rope_dim=8,v_head_dim=16")


def test_mla_moe_runs_on_four_gloo_ranks_as_one_process():
    """The searched tp layout splits MLA's down-projections (their latents reach the latent norms split
    or as partial sums: ``apply`` makes the normalized dim whole there); with ep and sp it matches one process."""
    from autoplan.apply.train import RunConfig
    from autoplan.apply.verify import verify

    configs = [RunConfig(model=MLA_MOE, plan=plan, steps=2, seq=16, global_batch=8, optimizer="sgd", lr=0.02)
               for plan in ("tp=2,dp=2,ep=2,sp=on", "tp=2,dp=2,ep=2,sp=off")]
    for check in verify(configs, nproc=4, timeout=600):
        assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"
        assert any("q_a_proj" in name for name, _, counted in check.tensor_errors if counted)


def test_run_refuses_mtp_models_with_one_message(capsys):
    from autoplan.cli import main

    code = main(["run", MLA_MOE + ",mtp_layers=1", "--plan", "dp=2", "--nproc", "2", "--seq", "16",
                 "--global-batch", "4"])
    assert code == 2 and "multi-token-prediction" in capsys.readouterr().err
