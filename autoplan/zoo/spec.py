"""Family spec strings: ``FAMILY:key=value,key=value,...`` → a zoo config.

Examples::

    gpt:layers=96,hidden=12288,heads=96,vocab=51200
    llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256
    moe:layers=32,hidden=4096,heads=32,kv_heads=8,vocab=32000,experts=8,topk=2,moe_ffn=14336

``layers``, ``hidden``, ``heads`` and ``vocab`` are required.  The family
sets the rest: gpt = GeLU 4h MLP, LayerNorm, tied head, learned positions,
dropout 0.1; llama = SwiGLU, RMSNorm, rotary positions, untied head; moe =
llama attention + MoE MLP.
"""
from __future__ import annotations

from dataclasses import fields

from autoplan.errors import UserError
from autoplan.zoo.common import ATTENTION_KINDS, MLP_KINDS, NORM_KINDS
from autoplan.zoo.gpt import GPTConfig
from autoplan.zoo.llama import LlamaConfig
from autoplan.zoo.moe import MoEConfig

REQUIRED = ("layers", "hidden", "heads", "vocab")
_COMMON = REQUIRED + ("kv_heads", "head_dim", "ffn", "mlp", "norm", "tie", "attention")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_dim", "v_head_dim")   # zoo.mla; kv_lora_rank > 0 turns it on
KEYS = {
    "gpt": _COMMON + ("dropout", "max_seq"),
    "llama": _COMMON + MLA_KEYS + ("mtp_layers",),
    "moe": _COMMON + MLA_KEYS + ("mtp_layers", "experts", "topk", "moe_ffn", "shared_experts", "dense_layers",
                      "capacity_factor", "groups", "topk_groups"),
}
CONFIGS = {"gpt": GPTConfig, "llama": LlamaConfig, "moe": MoEConfig}
_CHOICES = {"mlp": MLP_KINDS, "norm": NORM_KINDS, "attention": ATTENTION_KINDS}
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_FLOATS = ("dropout", "capacity_factor")

# Upper bounds on spec sizes, each far above every published model (largest: 128 layers in
# GPT-1T, hidden 25,600 in MT-NLG, vocab 256,000 in Gemma, 256 routed experts in DeepSeek-V3) and
# low enough that building the model on the meta device stays quick (~8 ms per layer, so
# 1,024 layers build in ~8 s) and no weight has more than 2^60 elements (torch's size arithmetic
# overflows int64 beyond 2^63).
MAXIMA = {"layers": 1024, "dense_layers": 1024, "hidden": 2 ** 17, "heads": 2 ** 12, "kv_heads": 2 ** 12,
          "head_dim": 2 ** 12, "ffn": 2 ** 20, "moe_ffn": 2 ** 20, "vocab": 2 ** 24, "experts": 2 ** 14,
          "topk": 2 ** 14, "shared_experts": 64, "max_seq": 2 ** 24, "groups": 2 ** 14, "topk_groups": 2 ** 14,
          "kv_lora_rank": 2 ** 17, "q_lora_rank": 2 ** 17, "qk_rope_dim": 2 ** 12, "v_head_dim": 2 ** 12,
          "mtp_layers": 16}
FLOAT_RANGES = {"dropout": (0.0, 1.0), "capacity_factor": (0.0, 1024.0)}   # [low, high); capacity > 0


def is_spec(text: str) -> bool:
    """True if ``text`` looks like ``family:...`` for a known family."""
    return text.split(":", 1)[0] in KEYS and ":" in text


def _usage(family: str) -> str:
    return (f"valid keys for {family}: {', '.join(KEYS[family])} "
            f"(required: {', '.join(REQUIRED)})")


def _value(family: str, key: str, raw: str):
    def bad(rule: str) -> UserError:
        return UserError(f"bad value {key}={raw!r} in {family} spec", f"{rule}; {_usage(family)}")

    if key in _CHOICES:
        if raw not in _CHOICES[key]:
            raise bad(f"{key} is one of {', '.join(_CHOICES[key])}")
        return raw
    if key == "tie":
        if raw.lower() not in _BOOLS:
            raise bad("tie is true or false")
        return _BOOLS[raw.lower()]
    try:
        value = float(raw) if key in _FLOATS else int(raw)
    except ValueError:
        raise bad(f"{key} must be {'a number' if key in _FLOATS else 'an integer'}") from None
    if key in _FLOATS:
        low, high = FLOAT_RANGES[key]
        if not low <= value < high or (key == "capacity_factor" and value == 0):
            raise bad(f"{key} must be a finite number in [{low:g}, {high:g})"
                      + (", above 0" if key == "capacity_factor" else ""))
        return value
    if value < 0 or (value == 0 and key in REQUIRED):
        raise bad(f"{key} must be positive")
    if value > MAXIMA[key]:
        raise bad(f"{key} is at most {MAXIMA[key]:,} (far above any published model; a model this size "
                  "cannot be built and traced in reasonable time)")
    return value


def parse_spec(text: str, seq: int = 0) -> LlamaConfig | GPTConfig:
    """Parse a family spec string into a config; bad input raises ``UserError``.

    A ``gpt`` spec without ``max_seq`` gets learned positions for the run's sequence length
    ``seq`` (when longer than the config's default, 2048): a user asking for that many tokens
    means it."""
    family, _, body = text.partition(":")
    if family not in KEYS:
        raise UserError(f"unknown model family {family!r} in {text!r}",
                        f"use one of: {', '.join(KEYS)}")
    values: dict[str, object] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in KEYS[family]:
            raise UserError(f"unknown key {key!r} in {family} spec {text!r}", _usage(family))
        values[key] = _value(family, key, raw.strip())
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise UserError(f"missing key(s) {', '.join(missing)} in {family} spec {text!r}",
                        _usage(family))
    if family == "gpt" and "max_seq" not in values and seq > GPTConfig.max_seq:
        values["max_seq"] = seq
    cfg_fields = {f.name for f in fields(CONFIGS[family])}
    cfg = CONFIGS[family](**{k: v for k, v in values.items() if k in cfg_fields})
    _check(family, cfg)
    return cfg


def _check(family: str, cfg) -> None:
    if not cfg.head_dim and cfg.hidden % cfg.heads:
        raise UserError(f"hidden ({cfg.hidden}) is not a multiple of heads ({cfg.heads}) in {family} spec",
                        "change hidden or heads, or give head_dim")
    if family != "gpt" and cfg.mla:
        _check_mla(family, cfg)
        return _check_moe(cfg) if family == "moe" else None
    head_dim = cfg.head_dim or cfg.hidden // cfg.heads
    if family != "gpt" and head_dim % 2:
        raise UserError(f"head_dim {head_dim} is odd in {family} spec: rotary embeddings (RoPE) rotate "
                        "pairs of channels",
                        "pick hidden/heads (or head_dim) even, e.g. hidden a multiple of 2·heads")
    if cfg.heads % cfg.n_kv_heads:
        raise UserError(f"heads ({cfg.heads}) is not a multiple of kv_heads ({cfg.n_kv_heads})",
                        "kv_heads must divide heads")
    if family == "moe":
        _check_moe(cfg)


def _check_mla(family: str, cfg) -> None:
    """MLA: the rotary slice is a positive even number of channels, and every head has its own key
    and value (no kv_heads grouping)."""
    if cfg.qk_rope_dim <= 0 or cfg.qk_rope_dim % 2:
        raise UserError(f"qk_rope_dim={cfg.qk_rope_dim} in {family} spec: multi-head latent attention "
                        "(kv_lora_rank > 0) rotates a slice of q and k, a positive even number of channels",
                        "give qk_rope_dim, e.g. 64 as DeepSeek-V3")
    if cfg.kv_heads not in (0, cfg.heads):
        raise UserError(f"kv_heads={cfg.kv_heads} with kv_lora_rank={cfg.kv_lora_rank} in {family} spec: "
                        "latent attention gives every head its own key and value", "drop kv_heads")


def _check_moe(cfg) -> None:
    if cfg.experts < 1 or not 1 <= cfg.topk <= cfg.experts:
        raise UserError(f"topk ({cfg.topk}) must be between 1 and experts ({cfg.experts})",
                        "set experts >= 1 and 1 <= topk <= experts")
    if cfg.dense_layers > cfg.layers:
        raise UserError(f"dense_layers ({cfg.dense_layers}) exceeds layers ({cfg.layers})",
                        "dense_layers must be at most layers")
    if cfg.groups and (cfg.experts % cfg.groups or not 0 < cfg.topk_groups <= cfg.groups
                       or cfg.topk > cfg.topk_groups * (cfg.experts // cfg.groups)):
        raise UserError(f"groups={cfg.groups}, topk_groups={cfg.topk_groups} do not fit experts={cfg.experts}, "
                        f"topk={cfg.topk}", "groups must divide experts and 0 < topk_groups <= groups, "
                        "with topk at most the experts of topk_groups groups")
