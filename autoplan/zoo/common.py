"""Building blocks shared by the zoo families: norms, MLPs, rotary embeddings, attention.

Plain ``torch.nn``; every module runs for real on CPU and traces on fake
tensors.  Tensors are batch-first: activations are ``[batch, seq, hidden]``,
attention operands ``[batch, heads, seq, head_dim]``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MLP_KINDS = ("gelu", "swiglu", "relu2")
NORM_KINDS = ("layernorm", "rmsnorm")
ATTENTION_KINDS = ("flash", "eager")


class DerivedSizes:
    """The sizes a family config leaves at 0 to mean "the usual": KV heads = heads, head dim =
    hidden / heads, FFN = 4 · hidden (a mixin for configs with ``heads``, ``kv_heads``,
    ``head_dim``, ``hidden`` and ``ffn`` fields)."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    ffn: int

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def d_ffn(self) -> int:
        return self.ffn or 4 * self.hidden


INIT_STD = 0.02


def init_weights(model: nn.Module, layers: int, std: float = INIT_STD) -> None:
    """GPT-2 / Megatron initialisation: every Linear weight, Embedding and raw expert tensor
    ~ N(0, std²), biases 0, norms 1, and the two projections that write into the residual
    stream (a module's ``RESIDUAL_OUT``: attention ``o_proj``, MLP ``down_proj``, expert
    ``w_down``) ~ N(0, std²/(2·layers)),
    so the stream's variance does not grow with depth (Radford et al. 2019, §2.3).

    With std = 0.02 a fresh model's logits have standard deviation ≈ 0.02·√hidden ≪ 1,
    so its cross-entropy starts at ≈ ln(vocab).
    """
    residual = std / math.sqrt(2 * max(layers, 1))
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.dim() == 1:
                nn.init.zeros_(p) if name == "bias" else nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=std)
    for module in model.modules():
        for name in getattr(module, "RESIDUAL_OUT", ()):
            nn.init.normal_(module.get_parameter(name), std=residual)


def make_norm(kind: str, hidden: int, bias: bool, eps: float = 1e-5) -> nn.Module:
    """LayerNorm (with or without bias) or RMSNorm over the last dim."""
    if kind == "layernorm":
        return nn.LayerNorm(hidden, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(hidden, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected one of {NORM_KINDS}")


class MLP(nn.Module):
    """Position-wise MLP ``hidden → ffn → hidden``.

    * ``gelu``:   down(gelu(up(x)))               (GPT, 2 matrices)
    * ``relu2``:  down(relu(up(x))²)              (squared ReLU, 2 matrices)
    * ``swiglu``: down(silu(gate(x)) · up(x))     (Llama, 3 matrices)
    """

    RESIDUAL_OUT = ("down_proj.weight",)      # writes into the residual stream (see init_weights)

    def __init__(self, hidden: int, ffn: int, kind: str = "gelu", bias: bool = False) -> None:
        super().__init__()
        if kind not in MLP_KINDS:
            raise ValueError(f"unknown mlp {kind!r}; expected one of {MLP_KINDS}")
        self.kind = kind
        if kind == "swiglu":
            self.gate_proj = nn.Linear(hidden, ffn, bias=bias)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        h = self.up_proj(x)
        h = F.gelu(h) if self.kind == "gelu" else torch.square(F.relu(h))
        return self.down_proj(h)


def rope_cos_sin(seq: int, head_dim: int, theta: float, device: torch.device,
                 dtype: torch.dtype, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables ``cos, sin`` of shape [seq, head_dim] (rotate-half layout) at
    ``positions`` [seq] (default 0..seq-1).

    Computed on the fly from ``arange`` (no buffers), so a model built on the
    meta device needs no re-initialisation before it runs.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    pos = (torch.arange(seq, device=device, dtype=torch.float32) if positions is None
           else positions.to(device=device, dtype=torch.float32))
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [batch, heads, seq, head_dim] by the tables [seq, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float,
                     eager: bool) -> torch.Tensor:
    """Causal self-attention; q [b, a, s, d], k/v [b, g, s, d] with a % g == 0 (GQA).

    ``eager=False`` calls ``F.scaled_dot_product_attention`` (flash attention
    on a GPU); ``eager=True`` spells it out (QKᵀ, mask, softmax, dropout, AV)
    so that every intermediate is a separate tensor (Korthikanti's 5as²b).
    """
    heads, groups = q.shape[1], k.shape[1]
    if not eager:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                              enable_gqa=groups != heads)
    if groups != heads:
        k = k.repeat_interleave(heads // groups, dim=1)
        v = v.repeat_interleave(heads // groups, dim=1)
    seq = q.shape[2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout, training=dropout > 0)
    return probs @ v


class Attention(nn.Module):
    """Multi-head / grouped-query self-attention with separate q, k, v projections.

    Separate projections (not one fused QKV matrix) so that sharding the
    output features of each projection keeps whole heads together under
    tensor parallelism.  ``rope=True`` rotates q and k by the (cos, sin)
    tables passed to ``forward``.
    """

    RESIDUAL_OUT = ("o_proj.weight",)

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool,
                 dropout: float = 0.0, attention: str = "flash") -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {attention!r}; expected one of {ATTENTION_KINDS}")
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.dropout, self.eager = dropout, attention == "eager"
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # type: ignore[arg-type]  # sin comes with cos
        dropout = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, dropout, self.eager)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
