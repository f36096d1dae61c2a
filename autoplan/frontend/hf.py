"""Tracing HuggingFace transformers models as a GPU training run would execute them.

Without a KV cache or attention mask (training), transformers checks the
position ids for *packed* sequences; on fake tensors that check cannot read
values, so it keeps a materialised [b, 1, s, s] mask and SDPA falls back
from flash attention to the memory-efficient kernel with an s² bias.  A real
run on ordinary (unpacked) batches finds no packing and uses flash
attention with ``is_causal``.  ``unpacked_sequences()`` makes the trace take
that path: while active, transformers' packed-sequence detection reports
"not packed".  Plans therefore assume one sequence per row, causal mask.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """While active, transformers (if imported) treats every row as one unpacked sequence."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original
