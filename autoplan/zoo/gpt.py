"""GPT (GPT-3 / Megatron-LM GPT): learned positions, pre-LayerNorm blocks, GeLU 4h MLP.

Like Megatron's GPT: every linear and norm has a bias, the output head is tied
to the token embedding, and dropout (0.1 by default) follows the embedding,
the attention softmax and both residual branches.  Parameter count
(Narayanan et al. 2021, Eq. 2):

    P = 12·l·h² · (1 + 13/(12h) + (V + s)/(12·l·h))

with l layers, hidden h, vocabulary V and s learned positions (the final
LayerNorm's 2h parameters are not in Eq. 2).  ``attention="eager"`` spells
attention out (QKᵀ, softmax, dropout, AV) instead of calling SDPA, which is
what Korthikanti et al.'s activation-memory formula sbh(34 + 5as/h) assumes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.common import MLP, Attention, DerivedSizes, init_weights, make_norm


@dataclass(frozen=True)
class GPTConfig(DerivedSizes):
    layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    kv_heads: int = 0          # 0: same as heads (multi-head attention)
    head_dim: int = 0          # 0: hidden // heads
    ffn: int = 0               # 0: 4 * hidden
    max_seq: int = 2048        # learned position embeddings
    dropout: float = 0.1
    attention: str = "flash"   # flash | eager
    mlp: str = "gelu"          # gelu | swiglu | relu2
    norm: str = "layernorm"    # layernorm | rmsnorm
    tie: bool = True           # output head shares the token embedding
    bias: bool = True


class Block(nn.Module):
    """x + drop(attn(ln1(x))); x + drop(mlp(ln2(x)))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(cfg.norm, cfg.hidden, cfg.bias)
        self.attn = Attention(cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.d_head, cfg.bias,
                              cfg.dropout, cfg.attention)
        self.ln_2 = make_norm(cfg.norm, cfg.hidden, cfg.bias)
        self.mlp = MLP(cfg.hidden, cfg.d_ffn, cfg.mlp, cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        x = x + F.dropout(self.attn(self.ln_1(x)), p, self.training)
        return x + F.dropout(self.mlp(self.ln_2(x)), p, self.training)


class GPT(nn.Module):
    """Token ids [batch, seq] → logits [batch, seq, vocab]."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_seq, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = make_norm(cfg.norm, cfg.hidden, cfg.bias)
        self.lm_head = None if cfg.tie else nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        init_weights(self, cfg.layers)

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``position_ids`` [1 or batch, seq]: the tokens' positions (default 0..seq-1; context
        parallelism passes each rank's own)."""
        seq = ids.shape[1]
        if position_ids is None and seq > self.config.max_seq:
            raise ValueError(f"sequence length {seq} exceeds max_seq={self.config.max_seq}")
        if position_ids is None:
            pos = torch.arange(seq, device=ids.device)
        else:       # [1, seq] as the 1-D default: one layout for the position table's output
            pos = position_ids[0] if position_ids.shape[0] == 1 else position_ids
        x = self.wte(ids) + self.wpe(pos)
        x = F.dropout(x, self.config.dropout if self.training else 0.0, self.training)
        for block in self.layers:
            x = block(x)
        x = self.ln_f(x)
        weight = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, weight)
