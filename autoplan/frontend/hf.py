"""Tracing HuggingFace transformers models as a GPU training run would execute them.

Three patches, all active only while tracing (``training_kernels()``):

* ``unpacked_sequences()``: without a KV cache or attention mask (training),
  transformers checks the position ids for *packed* sequences; on fake
  tensors that check cannot read values, so it keeps a materialised
  [b, 1, s, s] mask and SDPA falls back from flash attention to the
  memory-efficient kernel with an s² bias.  A real run on ordinary
  (unpacked) batches finds no packing and uses flash attention with
  ``is_causal``.  While active, transformers' packed-sequence detection
  reports "not packed".  Plans therefore assume one sequence per row,
  causal mask.
* ``unpadded_rows()``: a model that makes its own all-ones padding mask
  (BART's decoder) hands it to transformers' mask builder, which may only
  skip the mask (and let SDPA run flash attention with ``is_causal``) after
  reading that no token is padding — values fake tensors do not have.
  While active, the builder's skip checks see no padding mask, as on a
  real batch without padding.
* ``sliding_window_kernels()``: a causal sliding-window layer (Mistral,
  Qwen2 with ``use_sliding_window``, Gemma 2/3 local layers) under ``sdpa``
  gets a materialised band mask from transformers once the sequence is
  longer than the window, i.e. the memory-efficient kernel with an s² bias
  at full s² FLOPs.  Training kernels (FlashAttention-2/3 ``window_size``)
  take the window natively.  While active, transformers' ``sdpa`` attention
  function drops that mask for causal self-attention with a window, runs
  causal flash attention, and tags the traced nodes with the window when it
  is shorter than the keys (``fx_meta.attention_window``); the converter scales the
  kernel's FLOPs to the band (``costs.window_fraction``).  The window is
  the ``sliding_window`` transformers passes the attention function (read
  from the config per layer).  Eager attention is left alone: it really
  computes and stores all s² scores.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from autoplan.frontend.fx_meta import attention_window


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """While active, transformers (if imported) treats every row as one unpacked sequence."""
    masking: Any = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def _without_padding(check: Callable) -> Callable:
    def skip(padding_mask, *args, **kwargs):
        return check(None, *args, **kwargs)
    return skip


@contextlib.contextmanager
def unpadded_rows() -> Iterator[None]:
    """While active, transformers' SDPA mask-skip checks treat every padding mask as all ones."""
    masking = sys.modules.get("transformers.masking_utils")
    names = [n for n in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa") if hasattr(masking, n)]
    originals = {n: getattr(masking, n) for n in names}
    for n, check in originals.items():
        setattr(masking, n, _without_padding(check))
    try:
        yield
    finally:
        for n, check in originals.items():
            setattr(masking, n, check)


def windowed_sdpa(original: Callable) -> Callable:
    """transformers' sdpa attention function, with sliding windows run as windowed flash attention."""
    def forward(module, query, key, value, attention_mask, *args, sliding_window=None, **kwargs):
        window = sliding_window if isinstance(sliding_window, int) and sliding_window > 0 else 0
        causal_self = getattr(module, "is_causal", True) and query.shape[2] == key.shape[2]
        if window and causal_self:          # the mask is the causal band: the kernel needs none
            with attention_window(window if window < key.shape[2] else 0):
                return original(module, query, key, value, None, *args, **kwargs)
        return original(module, query, key, value, attention_mask, *args, sliding_window=sliding_window,
                        **kwargs)
    return forward


@contextlib.contextmanager
def sliding_window_kernels() -> Iterator[None]:
    """While active, transformers' ``sdpa`` attention runs sliding windows as windowed flash attention."""
    utils = sys.modules.get("transformers.modeling_utils")
    interface = getattr(utils, "AttentionInterface", None)
    mapping = getattr(interface, "_global_mapping", None)
    if not isinstance(mapping, dict) or "sdpa" not in mapping:
        yield
        return
    original = mapping["sdpa"]
    mapping["sdpa"] = windowed_sdpa(original)
    try:
        yield
    finally:
        mapping["sdpa"] = original


@contextlib.contextmanager
def training_kernels() -> Iterator[None]:
    """All three patches (see the module docstring)."""
    with unpacked_sequences(), unpadded_rows(), sliding_window_kernels():
        yield
