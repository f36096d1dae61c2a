"""Fit NVLink ring efficiency and per-step latency to vTrain's NCCL all-reduce LUTs (8x A100).

    python experiments/fit_nccl_lut.py

``../shared/reference/vtrain/nccl_lut_a100/AR_GPU{n}_1M_1024M_LUT``: nccl-tests all-reduce on
n = 2..8 A100-SXM4 GPUs of one NVSwitch node, 1 MiB to 1 GiB (time = mean of the out-of-place
and in-place columns).  Every measurement is priced with ``costmodels.collectives`` on the
node of ``vtrain/cluster_a100.yaml`` (n GPUs), i.e. the ring formula

    t = launch_latency + 2(n-1)·nvlink_latency + 2(n-1)/n · S / (nvlink_bw · nvlink_efficiency)

A grid over (nvlink_efficiency, nvlink_latency, launch_latency) minimises the RMS of
log(predicted / measured) over every 16th size of each LUT
(448 points; the report covers all 7 x 1,024).
Prints the winner and the per-n, per-size-band mean ratio; the winner goes to the a100 entry
of ``topologies/systems.yaml`` (NVLink 3 only: H100's NVLink 4 figures stay nccl-tests#212's).
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_regimes as pr  # noqa: E402
from costmodels.collectives import collective_time  # noqa: E402

LUT_DIR = os.path.join(pr.REFERENCE, "vtrain", "nccl_lut_a100")
EFFICIENCIES = [0.64 + 0.01 * i for i in range(17)]        # 0.64 .. 0.80
LATENCIES_US = [0.5 * i for i in range(17)]                # 0 .. 8 us per step
LAUNCH_US = [4.0 * i for i in range(1, 17)]                # 4 .. 64 us per call
BEFORE = {"nvlink_efficiency": 0.822, "nvlink_latency": 1.0e-6, "launch_latency": 6.0e-6}  # network.yaml
BANDS = ((1 << 20, 8 << 20), (8 << 20, 64 << 20), (64 << 20, 1 << 31))


def measurements() -> list[tuple[int, float, float]]:
    """(GPUs, bytes, seconds) for every LUT row."""
    out = []
    for path in sorted(glob.glob(os.path.join(LUT_DIR, "AR_GPU*_LUT"))):
        n = int(re.search(r"AR_GPU(\d+)_", path).group(1))  # type: ignore[union-attr]  # the glob matched it
        with open(path) as f:
            for rec in list(csv.reader(f))[1:]:
                out.append((n, float(rec[0]), (float(rec[3]) + float(rec[5])) / 2e9))
    return out


def predicted(rows, efficiency: float, latency_s: float, launch_s: float) -> list[float]:
    """Model seconds for every row with the given NVLink and launch parameters."""
    clusters = {}
    out = []
    for n, size, _ in rows:
        if n not in clusters:
            c = pr.cluster(f"vtrain:{n}")
            c = dataclasses.replace(c, nvlink_efficiency=efficiency, nvlink_latency=latency_s,
                                    launch_latency=launch_s)
            clusters[n] = (c, c.span(range(n)))
        cluster, span = clusters[n]
        out.append(collective_time("all_reduce", size, span, cluster))
    return out


def rms_log(rows, model) -> float:
    return math.sqrt(sum(math.log(p / t) ** 2 for (_, _, t), p in zip(rows, model)) / len(rows))


def main() -> int:
    rows = measurements()
    sample = rows[::16]            # every 16th size of each LUT for the grid; all rows reported
    best = None
    for eff in EFFICIENCIES:
        for lat in LATENCIES_US:
            for launch in LAUNCH_US:
                err = rms_log(sample, predicted(sample, eff, lat * 1e-6, launch * 1e-6))
                if best is None or err < best[0]:
                    best = (err, eff, lat, launch)
    _, eff, lat, launch = best  # type: ignore[misc]  # the grid is not empty
    model = predicted(rows, eff, lat * 1e-6, launch * 1e-6)
    err = rms_log(rows, model)
    old = predicted(rows, BEFORE["nvlink_efficiency"], BEFORE["nvlink_latency"], BEFORE["launch_latency"])
    print(f"fitted: nvlink_efficiency {eff:.3f}, nvlink_latency {lat:.2f} us, launch_latency {launch:.1f} us: "
          f"RMS log error {err:.3f} (before, {BEFORE}: {rms_log(rows, old):.3f})")
    print("GPUs  band        mean predicted/measured (fitted, before)")
    for n in sorted({r[0] for r in rows}):
        for lo, hi in BANDS:
            idx = [i for i, r in enumerate(rows) if r[0] == n and lo <= r[1] < hi]
            ratio = sum(model[i] / rows[i][2] for i in idx) / len(idx)
            before = sum(old[i] / rows[i][2] for i in idx) / len(idx)
            print(f"{n:>4}  {lo >> 20:>4}-{hi >> 20:<5} MiB  {ratio:.3f}  {before:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
