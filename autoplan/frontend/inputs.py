"""The model call's inputs, and what they say about the model's throughput unit.

Inputs are a model call's (positional args, keyword args).  Without an
``example_inputs(batch, seq)`` in the model file they are token ids, a
LongTensor [batch, seq] in [0, vocab): positional for a decoder-only model,
``input_ids`` and ``decoder_input_ids`` (both ``seq`` long) for a
transformers encoder-decoder (``config.is_encoder_decoder``: T5, BART).
``example_inputs`` may return one tensor, a tuple/list (positional) or a
dict (keywords).

A model *takes tokens* when its first input tensor is integer-typed of shape
[batch, seq]: throughput is then counted in tokens.  Otherwise (pixels,
audio features...: a ViT's [batch, 3, 224, 224]) the model's unit is the
sample, and ``seq`` does not reach it; ``positions`` is then the sequence
length its blocks see (dim 1 of the first block's first 3-D input: 257 for
ViT-H/14 at 224 px, 256 patches + the class token).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from autoplan.frontend.fakes import to_fake

ModelInputs = tuple[tuple, dict]


def default_inputs(model: nn.Module, vocab: int, batch: int, seq: int) -> ModelInputs:
    """Token ids (see module docstring); call inside the fake mode."""
    tokens = lambda: torch.randint(0, max(vocab, 2), (batch, seq))  # noqa: E731
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return (), {"input_ids": tokens(), "decoder_input_ids": tokens()}
    return (tokens(),), {}


def as_model_inputs(value: Any, mode) -> ModelInputs:
    """``example_inputs()``'s value as (args, kwargs) of fake tensors."""
    if isinstance(value, dict):
        return (), to_fake(dict(value), mode)
    args = value if isinstance(value, tuple) else tuple(value) if isinstance(value, list) else (value,)
    return to_fake(args, mode), {}


def takes_tokens(inputs: ModelInputs, batch: int, seq: int) -> bool:
    """True when the first input tensor is integer ids of shape [batch, seq]."""
    first = next((x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)), None)
    return (first is not None and not first.is_floating_point() and not first.is_complex()
            and tuple(first.shape) == (batch, seq))


def block_positions(first_block_inputs: list, seq: int, tokens: bool) -> int:
    """Sequence positions per sample the blocks see: ``seq`` for token models, else dim 1 of the
    first block's first 3-D input (1 when it has none)."""
    if tokens:
        return seq
    shape = next((s.shape for s in first_block_inputs if len(s.shape) == 3), None)
    return int(shape[1]) if shape is not None else 1
