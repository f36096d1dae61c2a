"""Multi-token prediction (MTP; DeepSeek-AI 2024, DeepSeek-V3 report §2.2, Fig. 3).

After the main model, ``D`` sequential modules each predict one more token ahead.  Module k at
position i combines the previous depth's hidden state h (the main model's last layer output for
k = 1) with the embedding of token t_{i+k}:

    h' = W·[RMSNorm(h); RMSNorm(Emb(t_{i+k}))]        (W: 2·hidden → hidden, no bias)
    h_k = Block(h')                                   (a transformer layer like the model's last)
    logits_k = Head(RMSNorm_k(h_k))                   (predicting t_{i+k+1})

The embedding and the output head are the main model's (shared parameters, as in the report and
in Megatron-Core, which keeps a copy of the embedding on the last pipeline stage for it).  The
training loss is L_main + λ/D · Σ_k L_k; the modules are dropped at inference.  The main model
returns its logits; the MTP loss joins its backward through ``AddLoss`` (Megatron-Core's
``MTPLossAutoScaler``: the identity forward, and the loss's gradient λ/D in backward), so every
trace and run of the model trains the modules.

DeepSeek-V3 has D = 1 (``num_nextn_predict_layers`` in its config.json) with an MoE layer:
11.6 B parameters on top of the 671 B main model (HF's 685 B checkpoint also stores the module's
own copies of the embedding and head, 1.85 B).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.common import make_norm

MTP_LOSS_SCALE = 0.1       # λ: Megatron-Core's --mtp-loss-scaling-factor default (DeepSeek-V3: 0.3, then 0.1)
IGNORE = -100              # cross-entropy's ignore_index: positions with no token k+1 ahead


class AddLoss(torch.autograd.Function):
    """``x`` unchanged; in backward, ``loss`` gets the gradient ``scale`` as well (so a model that
    returns ``x`` trains on ``loss`` too; Megatron-Core's ``MTPLossAutoScaler``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.save_for_backward(loss)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (loss,) = ctx.saved_tensors
        return grad, torch.full_like(loss, ctx.scale), None


class MTPModule(nn.Module):
    """One prediction depth: ``(h, embedding of the token k ahead) → h_k`` (module docstring)."""

    def __init__(self, hidden: int, norm: str, eps: float, block: nn.Module) -> None:
        super().__init__()
        self.hidden_norm = make_norm(norm, hidden, bias=False, eps=eps)
        self.embedding_norm = make_norm(norm, hidden, bias=False, eps=eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = block
        self.norm = make_norm(norm, hidden, bias=False, eps=eps)      # before the shared head

    def forward(self, h: torch.Tensor, ahead: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.block(self.proj(torch.cat((self.hidden_norm(h), self.embedding_norm(ahead)), dim=-1)), cos, sin)


def shifted(x: torch.Tensor, k: int, fill: float | int) -> torch.Tensor:
    """``x`` [batch, seq, ...] moved k positions earlier along seq, the last k positions ``fill``."""
    tail = x.new_full((x.shape[0], k, *x.shape[2:]), fill)
    return torch.cat((x[:, k:], tail), dim=1)


def mtp_loss(modules: nn.ModuleDict, head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor,
             embedded: torch.Tensor, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Mean over the depths of each module's cross-entropy on the token k+1 ahead (fp32 logits);
    ``head`` maps normed hidden states to logits."""
    losses = []
    for k, module in enumerate(cast(Iterable[MTPModule], modules.values()), start=1):
        h = module(h, shifted(embedded, k, 0.0), cos, sin)
        logits = head(module.norm(h))
        target = shifted(ids, k + 1, IGNORE)
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE))
    return torch.stack(losses).mean()
