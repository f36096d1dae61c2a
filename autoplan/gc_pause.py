"""``cyclic_gc_paused()``: run a block with Python's cyclic garbage collector paused.

Reference counting still frees every acyclic object at once; only the cycle detector waits.
Tracing and the search allocate millions of short-lived objects, and each automatic
collection walks everything alive (torch's modules, the traced graph, the search caches).
Measured on this project's 2-core machine, GPT-3 175B / h100x1024: the search on one worker
7.8 s with the collector running, 6.4 s paused (peak RSS 502 MB vs 508 MB); its trace 1.6 s
vs 1.3 s.  The cold figures in experiments/RESULTS.md are with it paused.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; restore its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
