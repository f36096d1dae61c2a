"""The GEMM-efficiency range a fitted compute profile writes under its ``uncertainty:`` key.

    block = gemm_range_block(errors, names, rows_text)

From the fit's own residuals on public rows: a row priced e too slow (e = predicted /
published − 1) is matched by a compute rate (1 + e)× the fitted one, so the range of the
``gemm_peak`` multiplier (``costmodels/uncertainty.yaml`` names it) spans 1 + min(e) …
1 + max(e), and always 1.  ``names`` name each row with its residual in the source line, so
the range says which published rows it comes from (public rows only: never a held-out one).
"""
from __future__ import annotations

HEADER = "uncertainty:          # multipliers on the values above (costmodels/uncertainty.yaml has the priors)\n"


def gemm_range_block(errors: list[float], names: list[str], rows_text: str) -> str:
    """The YAML ``uncertainty:`` block; ``rows_text`` says which public rows (e.g. "the public H100 rows")."""
    if not errors or len(errors) != len(names):
        raise ValueError("a range needs one residual per named row")
    low, high = min(0.0, *errors), max(0.0, *errors)
    listed = ", ".join(f"{n} {e:+.1%}" for n, e in zip(names, errors))
    return (HEADER + "  gemm_peak:\n"
            f"    low: {1 + low:.3f}\n"
            f"    high: {1 + high:.3f}\n"
            f"    source: \"residuals of this fit on {rows_text}: {listed}\"\n")
