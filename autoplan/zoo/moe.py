"""Mixture-of-experts transformer (Mixtral / DeepSeek style) with static-shape dispatch.

Llama-style attention; the MLP of each MoE layer is ``experts`` SwiGLU
experts of width ``moe_ffn``, ``topk`` of which each token uses, plus
``shared_experts`` always-on experts (one plain MLP of width
``shared_experts · moe_ffn``).  The first ``dense_layers`` layers are dense
Llama blocks of width ``ffn``.

Dispatch has static shapes, so it traces without data-dependent control
flow and shards like any other op (capacity-based, as GShard / Switch):

1. router logits [T, E] → top-k (values, expert ids) [T, k]; gate weights =
   softmax over the k chosen logits (Mixtral).  With group-limited routing
   (``groups``, ``topk_groups``: DeepSeek-V3's 8 groups, best 4) a group scores
   its best expert's logit and only the experts of a token's ``topk_groups``
   best groups compete (the others are masked to −∞).
2. capacity C = ceil(T·k / E · capacity_factor).  Choices are ranked k-major
   (every token's first choice before any second choice); a choice's
   position in its expert is the running count (cumsum of one-hot) of
   earlier choices of that expert.  Choices at position ≥ C are dropped.
3. tokens are scattered into an [E·C + 1, h] buffer (the last row collects
   dropped choices and is discarded), viewed as [E, C, h].
4. expert GEMMs are batched matmuls with [E, h, f] / [E, f, h] parameters.
5. outputs are gathered back per choice, weighted by the gate and summed
   over the k choices.

Top-k routing is a selection (its gradient flows through the gate weights
only), as in every token-choice MoE.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.common import MLP, make_norm
from autoplan.zoo.llama import Block as DenseBlock
from autoplan.zoo.llama import Llama, LlamaConfig, make_attention


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    experts: int = 8
    topk: int = 2
    moe_ffn: int = 0            # 0: same as ffn
    shared_experts: int = 0
    dense_layers: int = 0       # leading dense layers (width ffn)
    capacity_factor: float = 1.0
    groups: int = 0             # group-limited routing (DeepSeek-V3): experts in this many groups,
    topk_groups: int = 0        # a token's top-k drawn from its best ``topk_groups`` (0: no limit)

    @property
    def d_moe_ffn(self) -> int:
        return self.moe_ffn or self.d_ffn


class Experts(nn.Module):
    """E SwiGLU experts as batched weights: x [E, C, h] → [E, C, h]."""

    RESIDUAL_OUT = ("w_down",)

    def __init__(self, experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_up = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_down = nn.Parameter(torch.empty(experts, ffn, hidden))
        for w in (self.w_gate, self.w_up, self.w_down):    # the model's init_weights sets the scale
            nn.init.normal_(w, std=1.0 / math.sqrt(w.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(F.silu(torch.bmm(x, self.w_gate)) * torch.bmm(x, self.w_up), self.w_down)


class MoE(nn.Module):
    """Router + capacity-based top-k dispatch + experts (+ shared experts)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.experts, self.topk, self.capacity_factor = cfg.experts, cfg.topk, cfg.capacity_factor
        self.groups, self.topk_groups = cfg.groups, cfg.topk_groups
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.routed = Experts(cfg.experts, cfg.hidden, cfg.d_moe_ffn)
        self.shared = (MLP(cfg.hidden, cfg.shared_experts * cfg.d_moe_ffn, "swiglu")
                       if cfg.shared_experts else None)

    def capacity(self, tokens: int) -> int:
        """Slots per expert: ceil(T·k/E · capacity_factor)."""
        return math.ceil(tokens * self.topk / self.experts * self.capacity_factor)

    def queue(self, onehot: torch.Tensor, position: torch.Tensor, cap: int) -> tuple[torch.Tensor, int]:
        """(each choice's place in its expert's queue, capacity) that decide what is dropped:
        here the running count ``position`` over this forward's choices and ``cap``.  A hook:
        under context parallelism ``apply`` replaces it on the instance with the place in the
        whole sequence's queue (``apply.context_parallel.SequenceQueue``), so the choices kept
        are those one process keeps; a kept choice's slot stays ``position`` (≤ its place)."""
        return position, cap

    def limit_groups(self, logits: torch.Tensor) -> torch.Tensor:
        """[T, E] router logits with the experts outside a token's ``topk_groups`` best groups (a
        group scored by its best expert) at −∞; unchanged without group-limited routing."""
        if self.groups <= 1 or not 0 < self.topk_groups < self.groups:
            return logits
        tokens, size = logits.shape[0], self.experts // self.groups
        best = logits.view(tokens, self.groups, size).amax(dim=-1).topk(self.topk_groups, dim=-1).indices
        keep = torch.zeros(tokens, self.groups, dtype=torch.bool, device=logits.device).scatter(1, best, True)
        return logits.masked_fill(~keep.repeat_interleave(size, dim=1), float("-inf"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens, experts, k = b * s, self.experts, self.topk
        cap = self.capacity(tokens)
        flat = x.reshape(tokens, h)
        top_logits, top_ids = self.limit_groups(self.router(flat)).topk(k, dim=-1)   # [T, k]
        gates = torch.softmax(top_logits, dim=-1)                            # [T, k]
        # rank choices k-major: choice i = (slot i // T, token i % T)
        expert_of = top_ids.t().reshape(tokens * k)                          # [T·k]
        onehot = F.one_hot(expert_of, experts)                               # [T·k, E]
        position = ((torch.cumsum(onehot, dim=0) - 1) * onehot).sum(dim=-1)  # [T·k]
        queue, cap = self.queue(onehot, position, cap)
        slot = torch.where(queue < cap, expert_of * cap + position,
                           torch.full_like(position, experts * cap))
        token_of = torch.arange(tokens, device=x.device).repeat(k)           # [T·k]
        buffer = flat.new_zeros(experts * cap + 1, h).index_put((slot,), flat[token_of], accumulate=True)
        out = self.routed(buffer[:-1].view(experts, cap, h)).reshape(experts * cap, h)
        out = torch.cat((out, out.new_zeros(1, h)))                          # dropped → 0
        weighted = out[slot] * gates.t().reshape(tokens * k, 1)
        y = weighted.view(k, tokens, h).sum(dim=0)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.view(b, s, h)


class MoEBlock(nn.Module):
    """x + attn(norm(x), rope); x + moe(norm(x))."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.attention_norm = make_norm(cfg.norm, cfg.hidden, bias=False, eps=cfg.norm_eps)
        self.attention = make_attention(cfg)
        self.ffn_norm = make_norm(cfg.norm, cfg.hidden, bias=False, eps=cfg.norm_eps)
        self.moe = MoE(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.moe(self.ffn_norm(x))


class MoETransformer(Llama):
    """A Llama whose layers are ``dense_layers`` dense blocks, then MoE blocks (and an MTP module's
    layer like the last one)."""

    def __init__(self, cfg: MoEConfig) -> None:
        last = DenseBlock if cfg.dense_layers >= cfg.layers else MoEBlock
        super().__init__(cfg, [DenseBlock(cfg) if i < cfg.dense_layers else MoEBlock(cfg)
                               for i in range(cfg.layers)], mtp_block=lambda: last(cfg))
