"""Fit a compute profile's per-op host floor (``host_floor_s``) to vTrain's single-node runs.

    python experiments/fit_host_floor.py [--every N] [--profile PATH]

The 1,440 runs of ``../shared/reference/vtrain/ground_truth_single.csv`` (Megatron-DeepSpeed,
fp16, one 8x A100 node; mapping in ``published_regimes.py``) are priced with the profile at
each ``host_floor_s`` of a grid (every ``N``-th row, default every 3rd), then a golden-section
search refines the best bracket.  The objective is the mean |predicted / measured - 1|; one
number serves every row.  Every other profile parameter stays as shipped (the GEMM, attention
and memory efficiencies are those fitted on the Megatron SC21 / Korthikanti rows).
Prints the grid and the winner; copy it into the profile.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_regimes as pr  # noqa: E402
from autoplan.cost import EstimateOptions  # noqa: E402

GRID_US = (0.0, 20.0, 35.0, 45.0, 50.0, 55.0, 60.0, 70.0)


def mean_error(profile_path: str, floor_s: float, rows: list) -> tuple[float, float, tuple[int, int]]:
    """(mean |error|, mean signed error, ranking) of ``rows`` with ``host_floor_s = floor_s``."""
    with open(profile_path) as f:
        data = yaml.safe_load(f)
    data["host_floor_s"] = floor_s
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data, f)
        path = f.name
    try:
        options = EstimateOptions(overlap_grad_reduce=False, profile=path)
        priced = [p for p in (pr.price_row(r, options) for r in rows) if p is not None]
    finally:
        os.unlink(path)
    s = pr.summary(priced)
    return s["mean_abs"], s["mean_signed"], pr.group_ranking(priced)


def golden(f, lo: float, hi: float, steps: int = 8) -> float:
    """Minimiser of a unimodal ``f`` on [lo, hi] by golden-section search (``steps`` shrinks)."""
    r = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return (a + b) / 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=3, help="price every N-th row (default 3)")
    ap.add_argument("--profile", default=pr.VTRAIN_PROFILE, help="profile to start from")
    args = ap.parse_args(argv)
    rows = pr.vtrain_rows()[::args.every]
    grid = []
    for us in GRID_US:
        mean, signed, (good, groups) = mean_error(args.profile, us * 1e-6, rows)
        grid.append((mean, us))
        print(f"host_floor_s={us:5.1f} us  mean |error| {mean:.1%}  signed {signed:+.1%}  "
              f"best plan within 5 %: {good}/{groups} groups", flush=True)
    best = min(grid)[1]
    i = GRID_US.index(best)
    lo, hi = GRID_US[max(i - 1, 0)], GRID_US[min(i + 1, len(GRID_US) - 1)]
    fitted = golden(lambda us: mean_error(args.profile, us * 1e-6, rows)[0], lo, hi)
    mean, signed, (good, groups) = mean_error(args.profile, round(fitted, 1) * 1e-6, rows)
    print(f"\nfitted host_floor_s = {round(fitted, 1)} us: mean |error| {mean:.1%}, signed {signed:+.1%}, "
          f"{good}/{groups} groups ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
