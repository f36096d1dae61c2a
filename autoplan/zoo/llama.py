"""Llama (Llama-2/3 style): RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP.

No biases, no dropout, an untied output head.  Parameters per layer:
2·h·(a·d) (q, o) + 2·h·(g·d) (k, v) + 3·h·f (SwiGLU) + 2h (norms), plus
V·h for the embedding and V·h for the head (h hidden, a heads, g kv heads,
d head dim, f ffn, V vocab).  Llama-3-8B: l=32, h=4096, a=32, g=8,
f=14336, V=128256 → 8.03 B.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.common import MLP, Attention, DerivedSizes, init_weights, make_norm, rope_cos_sin
from autoplan.zoo.mla import MLAttention
from autoplan.zoo.mtp import MTP_LOSS_SCALE, AddLoss, MTPModule, mtp_loss


@dataclass(frozen=True)
class LlamaConfig(DerivedSizes):
    layers: int
    hidden: int
    heads: int
    vocab: int
    kv_heads: int = 0          # 0: same as heads
    head_dim: int = 0          # 0: hidden // heads
    ffn: int = 0               # 0: 4 * hidden
    mlp: str = "swiglu"        # swiglu | gelu | relu2
    norm: str = "rmsnorm"      # rmsnorm | layernorm
    tie: bool = False
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    attention: str = "flash"   # flash | eager
    # Multi-head latent attention (DeepSeek-V2/V3, ``zoo.mla``) when kv_lora_rank > 0: ``head_dim`` is
    # then the q/k "nope" part, the q/k head is head_dim + qk_rope_dim and the value head v_head_dim.
    kv_lora_rank: int = 0      # 0: grouped-query attention
    q_lora_rank: int = 0       # MLA: rank of the query down-projection (0: one full-rank q projection)
    qk_rope_dim: int = 0       # MLA: the decoupled rotary slice of q and k
    v_head_dim: int = 0        # MLA: value head size (0: head_dim)
    mtp_layers: int = 0        # multi-token-prediction depths after the last layer (``zoo.mtp``; DeepSeek-V3: 1)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def rope_dim(self) -> int:
        """Channels the rotary tables cover: the rotary slice under MLA, else the whole head."""
        return self.qk_rope_dim if self.mla else self.d_head


def make_attention(cfg: LlamaConfig) -> nn.Module:
    """The config's attention: MLA when ``kv_lora_rank`` is set, else grouped-query attention."""
    if cfg.mla:
        return MLAttention(cfg.hidden, cfg.heads, q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
                           nope=cfg.d_head, rope=cfg.qk_rope_dim, v_head_dim=cfg.v_head_dim or cfg.d_head,
                           eps=cfg.norm_eps, attention=cfg.attention)
    return Attention(cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.d_head, bias=False, attention=cfg.attention)


class Block(nn.Module):
    """x + attn(norm(x), rope); x + mlp(norm(x)).  ``ffn`` overrides the config's."""

    def __init__(self, cfg: LlamaConfig, ffn: int = 0) -> None:
        super().__init__()
        self.attention_norm = make_norm(cfg.norm, cfg.hidden, bias=False, eps=cfg.norm_eps)
        self.attention = make_attention(cfg)
        self.ffn_norm = make_norm(cfg.norm, cfg.hidden, bias=False, eps=cfg.norm_eps)
        self.feed_forward = MLP(cfg.hidden, ffn or cfg.d_ffn, cfg.mlp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids [batch, seq] → logits [batch, seq, vocab].

    With ``mtp_layers`` the model also holds that many multi-token-prediction modules
    (``zoo.mtp``; ``mtp_block`` builds each one's layer, a ``Block`` by default) in a
    ``ModuleDict``, not a list: they are not repeats of the layer stack, they run after it."""

    def __init__(self, cfg: LlamaConfig, blocks: list[nn.Module] | None = None,
                 mtp_block: Callable[[], nn.Module] | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(blocks if blocks is not None
                                    else (Block(cfg) for _ in range(cfg.layers)))
        self.norm = make_norm(cfg.norm, cfg.hidden, bias=False, eps=cfg.norm_eps)
        self.output = None if cfg.tie else nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        make_block = mtp_block or (lambda: Block(cfg))
        self.mtp = nn.ModuleDict({str(k): MTPModule(cfg.hidden, cfg.norm, cfg.norm_eps, make_block())
                                  for k in range(1, cfg.mtp_layers + 1)}) if cfg.mtp_layers else None
        init_weights(self, cfg.layers)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of normed hidden states (the tied embedding or the output layer)."""
        return F.linear(x, self.tok_embeddings.weight if self.output is None else self.output.weight)

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``position_ids`` [1, seq]: the tokens' positions (default 0..seq-1; context
        parallelism passes each rank's own)."""
        x = embedded = self.tok_embeddings(ids)
        cos, sin = rope_cos_sin(ids.shape[1], self.config.rope_dim, self.config.rope_theta,
                                ids.device, x.dtype, None if position_ids is None else position_ids[0])
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        if self.mtp is None:
            return logits
        loss = mtp_loss(self.mtp, self.head, x, embedded, ids, cos, sin)
        return AddLoss.apply(logits, loss, MTP_LOSS_SCALE / len(self.mtp))
