"""Number and rank-list formatting shared by the Markdown, rich and HTML renderers."""
from __future__ import annotations

from autoplan.mesh import ranks_text  # noqa: F401  (re-exported for the explainer)


def seconds(s: float) -> str:
    """Seconds as "1.234 s", "12.3 ms" or "45 µs"."""
    a = abs(s)
    if a >= 1.0:
        return f"{s:.3f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    if a == 0.0:
        return "0"
    return f"{s * 1e6:.0f} µs"


def signed_seconds(s: float) -> str:
    """A difference in seconds with its sign; below half a microsecond it is "0"."""
    if abs(s) < 5e-7:
        return "0"
    return ("+" if s > 0 else "") + seconds(s)


def size(nbytes: float) -> str:
    """Bytes as "6.0 MiB" (binary units)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def count(n: float) -> str:
    return f"{n:,.0f}"


AXIS_NAMES = {"tp": "TP", "sp": "SP", "cp": "CP", "ep": "EP", "pp": "PP", "dp": "DP", "embed": "embedding"}
KIND_NAMES = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_gather": "all-gather",
              "all_to_all": "all-to-all", "p2p": "P2P"}
