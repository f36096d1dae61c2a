"""Fit the A100 compute profile's physical parameters to the published Megatron runs.

    python experiments/fit_a100_profile.py [--quick]

Grid search over the GEMM peak fraction, the GEMM half-efficiency dim and the elementwise
fusion factor of ``costmodels/profiles/a100.yaml``; every grid point prices every row of
``validate_published.py`` (the same rule for the unpublished knobs) and reports MAPE and
max error on iteration time.  One set of parameters serves all rows: nothing per row.
Prints the grid sorted by MAPE; copy the winner into costmodels/profiles/a100.yaml.
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


def mape_for(params: dict, models: dict) -> tuple[float, float]:
    base = yaml.safe_load(open(os.path.join(PROFILE_DIR, "a100.yaml")))
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2x2x2 grid")
    args = ap.parse_args(argv)
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
