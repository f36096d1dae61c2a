"""Model zoo: published architectures as small readable ``torch.nn`` files.

Families (one file each): ``gpt`` (GPT-3 / Megatron GPT), ``llama``
(Llama-3), ``moe`` (Mixtral / DeepSeek style, Llama attention + MoE MLP).
Each zoo entry is a family config; ``build(cfg)`` returns the module (call
it under ``torch.device("meta")`` to allocate nothing).

Entries and their published sizes:

* ``gpt3-175b`` (174.6 B), Korthikanti's ``gpt-22b`` and the Megatron SC21
  Table 1 sweep ``gpt-1.7b`` … ``gpt-1t`` (V = 51,200, 2048 learned
  positions, tied head: Eq. 2 reproduces each size).
* ``llama3-8b`` (8.03 B), ``llama3-70b`` (70.6 B), ``llama3-405b`` (405.9 B).
* ``mixtral-8x7b`` (46.7 B), ``mixtral-8x22b`` (141 B).
* ``deepseek-v3`` (≈671 B): 61 layers, hidden 7168, 3 leading dense layers
  (ffn 18432), then 256 routed experts (top-8, width 2048) + 1 shared expert,
  V = 129,280, multi-head latent attention (``zoo.mla``: 128 heads, q_lora_rank
  1536, kv_lora_rank 512, q/k head 128 + 64 rotary, v head 128; 187.1 M
  parameters per layer, as deepseek-ai/DeepSeek-V3's config.json) and one
  multi-token-prediction module (``zoo.mtp``, an MoE layer: +11.6 B, so 682.6 B
  built; the published 671 B is the main model).
  **Approximation:** its router is a softmax top-k (DeepSeek-V3 uses sigmoid
  scores with a bias term).
"""
from __future__ import annotations

from dataclasses import replace

from torch import nn

from autoplan.ir import ModelInfo
from autoplan.zoo.gpt import GPT, GPTConfig
from autoplan.zoo.llama import Llama, LlamaConfig
from autoplan.zoo.moe import MoEConfig, MoETransformer

_SC21 = {  # Narayanan et al. 2021, Table 1: (heads, hidden, layers)
    "gpt-1.7b": (24, 2304, 24), "gpt-3.6b": (32, 3072, 30), "gpt-7.5b": (32, 4096, 36),
    "gpt-18.4b": (48, 6144, 40), "gpt-39.1b": (64, 8192, 48), "gpt-76.1b": (80, 10240, 60),
    "gpt-145.6b": (96, 12288, 80), "gpt-310.1b": (128, 16384, 96), "gpt-529.6b": (128, 20480, 105),
    "gpt-1t": (160, 25600, 128),
}

ZOO: dict[str, GPTConfig | LlamaConfig] = {
    "gpt3-175b": GPTConfig(layers=96, hidden=12288, heads=96),
    "gpt-22b": GPTConfig(layers=48, hidden=6144, heads=64),
    **{name: GPTConfig(layers=l, hidden=h, heads=a) for name, (a, h, l) in _SC21.items()},
    "llama3-8b": LlamaConfig(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
    "llama3-70b": LlamaConfig(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256),
    "llama3-405b": LlamaConfig(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
                               vocab=128256),
    "mixtral-8x7b": MoEConfig(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                              experts=8, topk=2, rope_theta=1e6),
    "mixtral-8x22b": MoEConfig(layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384, vocab=32768,
                               experts=8, topk=2, rope_theta=1e6),
    "deepseek-v3": MoEConfig(layers=61, hidden=7168, heads=128, head_dim=128, ffn=18432, vocab=129280,
                             experts=256, topk=8, moe_ffn=2048, shared_experts=1, dense_layers=3, norm_eps=1e-6,
                             rope_theta=10000.0, groups=8, topk_groups=4, kv_lora_rank=512, q_lora_rank=1536,
                             qk_rope_dim=64, v_head_dim=128, mtp_layers=1),
}



DEEPSEEK_NOTE = "softmax top-k router (DeepSeek-V3 scores experts with a sigmoid and a bias term)"


# Published parameter counts (billions) the zoo reproduces (tests check 0.5 %): the main model, without
# multi-token-prediction modules (DeepSeek-V3's 671 B; its MTP module adds 11.6 B: ``zoo.mtp``).
PUBLISHED_PARAMS_B = {
    "gpt3-175b": 174.6, "llama3-8b": 8.03, "llama3-70b": 70.6, "llama3-405b": 405.9,
    "mixtral-8x7b": 46.7, "mixtral-8x22b": 141.0, "deepseek-v3": 671.0,
}


def names() -> tuple[str, ...]:
    return tuple(ZOO)


def family(cfg: GPTConfig | LlamaConfig) -> str:
    if isinstance(cfg, MoEConfig):
        return "moe"
    return "gpt" if isinstance(cfg, GPTConfig) else "llama"


def build(cfg: GPTConfig | LlamaConfig) -> nn.Module:
    """The model for a family config (call under ``torch.device("meta")`` to allocate nothing)."""
    if isinstance(cfg, MoEConfig):
        return MoETransformer(cfg)
    if isinstance(cfg, LlamaConfig):
        return Llama(cfg)
    return GPT(cfg)


def with_experts(cfg: MoEConfig, experts: int) -> MoEConfig:
    """The same MoE config with another expert count (the frontend uses it to find expert dims)."""
    return replace(cfg, experts=experts, topk=min(cfg.topk, experts))


def model_info(name: str, cfg: GPTConfig | LlamaConfig) -> ModelInfo:
    """ModelInfo for a family config.  Under MLA (``kv_lora_rank``) every head has its own key and
    value (kv heads = heads), the head size is the q/k head (nope + rotary, as ``frontend.info``
    reads a transformers MLA config) and ``v_head_dim`` the value head."""
    moe = isinstance(cfg, MoEConfig)
    mla = isinstance(cfg, LlamaConfig) and cfg.mla
    return ModelInfo(
        name=name, family=family(cfg), layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
        kv_heads=cfg.heads if mla else cfg.n_kv_heads, ffn=cfg.d_ffn, vocab=cfg.vocab,
        head_dim=cfg.d_head + cfg.qk_rope_dim if mla else cfg.d_head,  # type: ignore[union-attr]  # mla: a LlamaConfig
        v_head_dim=(cfg.v_head_dim or cfg.d_head) if mla else 0,  # type: ignore[union-attr]
        kv_lora_rank=cfg.kv_lora_rank if mla else 0, q_lora_rank=cfg.q_lora_rank if mla else 0,  # type: ignore[union-attr]
        qk_rope_dim=cfg.qk_rope_dim if mla else 0,  # type: ignore[union-attr]
        mtp_layers=cfg.mtp_layers if isinstance(cfg, LlamaConfig) else 0,
        # ignore[union-attr]: mypy does not narrow cfg through ``moe``; each read is guarded by it
        experts=cfg.experts if moe else 0, topk=cfg.topk if moe else 0,  # type: ignore[union-attr]
        moe_ffn=cfg.d_moe_ffn if moe else 0, shared_experts=cfg.shared_experts if moe else 0,  # type: ignore[union-attr]
        dense_layers=cfg.dense_layers if moe else 0, tied_embeddings=cfg.tie,  # type: ignore[union-attr]
        expert_groups=cfg.groups if moe else 0, topk_groups=cfg.topk_groups if moe else 0,  # type: ignore[union-attr]
        notes=(DEEPSEEK_NOTE,) if name == "deepseek-v3" else (),
    )
