"""Activation recomputation of a stage's blocks (``recompute=full|selective|none``).

* ``full``: each block keeps only its input; backward reruns the block's forward
  (``torch.utils.checkpoint``, non-reentrant).
* ``selective``: torch selective activation checkpointing that keeps the outputs
  of the matrix multiplications (the expensive ops) and recomputes everything
  else: the attention core (Megatron's selective choice), softmax, norms and
  activation functions.  Saving only GEMM outputs is also what keeps SAC correct:
  a saved output must not be mutated in place later in the forward (RMSNorm's
  ``mean(x²).add_(eps)`` does that to an intermediate).

The block's ``forward`` is wrapped in place, so parameter names do not change.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

aten = torch.ops.aten
SAVED_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def _gemm_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_gemm_policy)


def _checkpointed(forward, selective: bool, *args, **kwargs):
    if selective:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def recompute_blocks(blocks: list[nn.Module], mode: str) -> None:
    """Wrap each block's forward for ``mode`` (none | selective | full)."""
    if mode == "none":
        return
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward, mode == "selective")
