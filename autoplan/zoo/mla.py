"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2 §2.1 and DeepSeek-V3 §2.1).

Queries and keys/values pass through low-rank latents; the positional part of q·kᵀ is a separate
("decoupled") rotary slice, its key shared by all heads.  Per token x [hidden], with ``a`` heads:

* query:  c_q = RMSNorm(W_qa·x) [q_lora_rank] → W_qb·c_q → a heads × (nope + rope)
  (``q_lora_rank = 0``: one full-rank projection x → a × (nope + rope), as DeepSeek-V2-Lite);
* key/value: W_kva·x → [c_kv (kv_lora_rank), k_rope (rope)]; RMSNorm(c_kv) → W_kvb →
  a heads × (nope + v);
* RoPE rotates the rope slices: q's per head, k_rope once (broadcast to every head);
* attention with q/k head ``nope + rope`` (DeepSeek-V3: 128 + 64 = 192) and v head ``v``
  (128), so the flash kernel, which needs equal head sizes, is replaced by the memory-efficient
  one on a GPU (``frontend.gpu_kernels``);
* output: a × v → hidden.

Parameters (bias-free): h·q_r + q_r + q_r·a·(n + r) + h·(kv_r + r) + kv_r + kv_r·a·(n + v) + a·v·h
(h hidden, n nope, r rope; DeepSeek-V3: 187,107,328 per layer).  Forward FLOPs per token: twice
the projection weights, plus 2·s·a·(n + r) for q·kᵀ and 2·s·a·v for p·v over s keys.

Dims of DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 128 heads, q_lora_rank 1536,
kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128.  Training keeps the
up-projections explicit (the weight absorption of W_kvb into q and o is an inference trick).
"""
from __future__ import annotations

import torch
from torch import nn

from autoplan.zoo.common import ATTENTION_KINDS, apply_rope, causal_attention


class MLAttention(nn.Module):
    """Multi-head latent attention (module docstring); rotary tables are [seq, rope]."""

    RESIDUAL_OUT = ("o_proj.weight",)

    def __init__(self, hidden: int, heads: int, *, q_lora_rank: int, kv_lora_rank: int, nope: int,
                 rope: int, v_head_dim: int, eps: float = 1e-6, attention: str = "flash") -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {attention!r}; expected one of {ATTENTION_KINDS}")
        self.heads, self.nope, self.rope, self.v_head_dim = heads, nope, rope, v_head_dim
        self.kv_lora_rank, self.eager = kv_lora_rank, attention == "eager"
        qk = nope + rope
        if q_lora_rank:
            self.q_a_proj = nn.Linear(hidden, q_lora_rank, bias=False)
            self.q_a_norm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, heads * qk, bias=False)
        else:
            self.q_proj = nn.Linear(hidden, heads * qk, bias=False)
        self.kv_a_proj = nn.Linear(hidden, kv_lora_rank + rope, bias=False)
        self.kv_a_norm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, heads * (nope + v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * v_head_dim, hidden, bias=False)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """[b, s, hidden] → [b, s, heads·(nope + rope)]."""
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a, nope, rope = self.heads, self.nope, self.rope
        q = self.query(x).view(b, s, a, nope + rope).transpose(1, 2)
        q_nope, q_rope = q.split([nope, rope], dim=-1)
        latent, k_rope = self.kv_a_proj(x).split([self.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent)).view(b, s, a, nope + self.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([nope, self.v_head_dim], dim=-1)
        k_rope = apply_rope(k_rope.unsqueeze(1), cos, sin).expand(b, a, s, rope)
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
        k = torch.cat((k_nope, k_rope), dim=-1)
        y = causal_attention(q, k, v, 0.0, self.eager)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, a * self.v_head_dim))
