"""What each tensor dim is, found by tracing twice at different sizes.

A region is traced at the run's (batch b, sequence s) and again at
(b₂, s₂) = (2b + 1, s // 2); the graphs are identical op for op, so each
output dim of each node has a size in both traces.  A dim is

* ``"batch"``  if it scales like the batch: size₂ · b = size · b₂
  (also batch·heads folded into one dim);
* ``"seq"``    if it scales like the sequence: size₂ · s = size · s₂
  (tokens, query or key positions);
* ``"tokens"`` if it scales like batch·seq (a flattened [b·s] dim, and
  token-proportional MoE dims: [b·s·k] choices, expert capacity — within
  rounding);
* ``""``       if its size does not change (hidden, heads, head_dim, ffn,
  vocab...), even when that size equals s or b.

(2b+1)/b > 2 and s₂/s = ½ keep the three scalings distinct for every b ≥ 1.
A dim that changes in any other way is reported as ``"seq"`` (it grows
with the sequence, e.g. a padded length).

``"expert"``: for models the frontend can rebuild with another expert count
(zoo and spec MoE models), MoE blocks are traced a third time with 2×
the experts; a dim that is ``""`` above and changes there is ``"expert"``.
For other models, a dim whose size equals the expert count, in a node
inside the module that owns the batched (≥ 3-dim) expert weights, is
``"expert"`` (a heuristic).
"""
from __future__ import annotations

BATCH, SEQ, TOKENS, EXPERT, MODEL = "batch", "seq", "tokens", "expert", ""


def alt_sizes(batch: int, seq: int) -> tuple[int, int]:
    """The second trace's (batch, seq)."""
    return 2 * batch + 1, max(seq // 2, 1)


def dim_role(size: int, size2: int, sizes: tuple[int, int], sizes2: tuple[int, int]) -> str:
    """Role of a dim of ``size`` in the first trace and ``size2`` in the second."""
    (b, s), (b2, s2) = sizes, sizes2
    if size == size2:
        return MODEL
    if size2 * b == size * b2:
        return BATCH
    if size2 * s == size * s2:
        return SEQ
    ratio = (b2 * s2) / (b * s)
    if abs(size2 - size * ratio) <= max(2.0, 0.02 * size * ratio):
        return TOKENS
    return SEQ


def shape_roles(shape: tuple[int, ...], shape2: tuple[int, ...], sizes: tuple[int, int],
                sizes2: tuple[int, int]) -> tuple[str, ...]:
    return tuple(dim_role(a, c, sizes, sizes2) for a, c in zip(shape, shape2))


def guessed_roles(shape: tuple[int, ...], sizes: tuple[int, int]) -> tuple[str, ...]:
    """Fallback when no second trace lines up: match sizes against b, s and b·s."""
    b, s = sizes
    def guess(n: int) -> str:
        if n == b * s and b > 1:
            return TOKENS
        if n == s:
            return SEQ
        if n == b and b > 1:
            return BATCH
        return MODEL
    return tuple(guess(n) for n in shape)
