"""Activation recomputation of a stage's blocks (``recompute=none|selective|op|full|full:N``).

* ``full``: each block keeps only its input; backward reruns the block's forward
  (``torch.utils.checkpoint``, non-reentrant).
* ``selective``: torch selective activation checkpointing that keeps the outputs
  of the matrix multiplications (the expensive ops) and recomputes everything
  else: the attention core (Megatron's selective choice), softmax, norms and
  activation functions.  Saving only GEMM outputs is also what keeps SAC correct:
  a saved output must not be mutated in place later in the forward (RMSNorm's
  ``mean(x²).add_(eps)`` does that to an intermediate).
* ``op``: torchtitan's selective op checkpointing: keep the output of the 1st, 3rd, 5th …
  ``aten.mm`` of the block and of the attention kernels, recompute every other op (what
  ``autoplan.sharding.price.op_saved`` prices).
* ``full:N`` / ``op:N``: ``full`` / ``op`` on the first N blocks of the stage, the rest keep everything.

The block's ``forward`` is wrapped in place, so parameter names do not change.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autoplan.plan import partial_recompute

aten = torch.ops.aten
SAVED_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def _gemm_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


ATTENTION_OPS = frozenset(getattr(aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu") if hasattr(aten, name))
MATMUL_OPS = frozenset({aten.mm.default, aten.addmm.default})   # as sharding.price.MATMUL_OPS


def _selective_context():
    return create_selective_checkpoint_contexts(_gemm_policy)


def _op_context():
    """Every other mm kept (counted separately in forward and in the recompute, which must agree)."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in MATMUL_OPS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            return CheckpointPolicy.MUST_SAVE if counts[key] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


CONTEXTS = {"selective": _selective_context, "op": _op_context}


def _checkpointed(forward, mode: str, *args, **kwargs):
    if mode in CONTEXTS:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=CONTEXTS[mode], **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def recompute_blocks(blocks: list[nn.Module], mode: str) -> None:
    """Wrap each block's forward for ``mode`` (none | selective | op | full | full:N | op:N)."""
    if mode == "none":
        return
    part = partial_recompute(mode)
    head, count = part if part is not None else (mode, len(blocks))
    for block in blocks[:count]:
        block.forward = functools.partial(_checkpointed, block.forward, head)
