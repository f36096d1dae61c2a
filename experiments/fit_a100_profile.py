"""Fit the A100 compute profile's physical parameters to the published Megatron runs.

    python experiments/fit_a100_profile.py [--quick]
    python experiments/fit_a100_profile.py --write-uncertainty

Grid search over the GEMM peak fraction, the GEMM half-efficiency dim and the elementwise
fusion factor of ``costmodels/profiles/a100.yaml``; every grid point prices every row of
``validate_published.py`` (the same rule for the unpublished knobs) and reports MAPE and
max error on iteration time.  One set of parameters serves all rows: nothing per row.
Prints the grid sorted by MAPE; copy the winner into costmodels/profiles/a100.yaml.

``--write-uncertainty`` fits nothing: it prices the same rows with the shipped profile and
writes the GEMM efficiency's range (its ``uncertainty:`` block, ``profile_ranges``) from their
residuals.  Those rows are public (``../shared/reference/calibration_runs.md`` §1a and §2b-c:
SC21 Table 1, Korthikanti Table 5 and its 530B DP=8 run), the rows the profile was fitted
to; no held-out row enters the range.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate_published as vp  # noqa: E402
from autoplan.cost import EstimateOptions  # noqa: E402
from costmodels.compute import PROFILE_DIR  # noqa: E402
from profile_ranges import HEADER, gemm_range_block  # noqa: E402

PROFILE = os.path.join(PROFILE_DIR, "a100.yaml")
ROWS_TEXT = "the public A100 rows of calibration_runs.md (SC21 Table 1, Korthikanti Table 5 and §6)"


def mape_for(params: dict, models: dict) -> tuple[float, float]:
    base = yaml.safe_load(open(PROFILE))
    base.update(params)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(base, f)
        path = f.name
    options = EstimateOptions(overlap_grad_reduce=False, profile=path)
    errors = []
    for row in vp.rows():
        e = vp.price(row, models, options)
        if e is not None:
            errors.append(abs(e.step_time_s - row.published_s) / row.published_s)
    os.unlink(path)
    return sum(errors) / len(errors), max(errors)


def write_uncertainty() -> str:
    """Replace a100.yaml's ``uncertainty:`` block (the rest of the file is kept byte for byte)
    with the range from the shipped profile's residuals on the public rows; returns the block."""
    names, errors = [], []
    for row, e, err, _ in vp.price_rows():
        if e is not None:
            names.append(f"{row.source} {row.name}")
            errors.append(err)
    block = gemm_range_block(errors, names, ROWS_TEXT)
    with open(PROFILE) as f:
        text = f.read()
    head = text[:text.index(HEADER)] if HEADER in text else text.rstrip("\n") + "\n"
    with open(PROFILE, "w") as f:
        f.write(head + block)
    return block


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2x2x2 grid")
    ap.add_argument("--write-uncertainty", action="store_true",
                    help="write a100.yaml's GEMM range from the shipped profile's residuals on the public rows")
    args = ap.parse_args(argv)
    if args.write_uncertainty:
        print(write_uncertainty(), end="")
        return 0
    peaks = [0.72, 0.80] if args.quick else [0.70, 0.72, 0.74, 0.76, 0.78, 0.80]
    halves = [96, 256] if args.quick else [64, 128, 192, 256]
    fusions = [0.5, 1.0] if args.quick else [0.5, 0.75, 1.0]
    models: dict = {}
    results = []
    t0 = time.perf_counter()
    for peak, half, fusion in itertools.product(peaks, halves, fusions):
        params = {"gemm_peak_fraction": peak, "gemm_half_dim": half, "fusion": fusion}
        mape, worst = mape_for(params, models)
        results.append((mape, worst, params))
        print(f"peak={peak:.2f} half_dim={half:>3} fusion={fusion:.2f}  MAPE {mape:.1%}  max {worst:.1%}", flush=True)
    print(f"\nbest ({time.perf_counter() - t0:.0f} s):")
    for mape, worst, params in sorted(results, key=lambda r: (r[0], r[1]))[:5]:
        print(f"  {params}  MAPE {mape:.1%}  max {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
