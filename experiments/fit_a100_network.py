"""Fit the unstated network of torchtitan's A100 FSDP rows: HDR 200G NICs per 8x A100 node.

    python experiments/fit_a100_network.py

torchtitan's ``docs/performance.md`` (Apr 2024) gives tokens/s of 8 FSDP2 runs on "64 A100
(80GB)" GPUs and nothing of their network.  Every row is priced (``published_regimes``,
gradient reduction overlapped, the A100 profile as shipped) on 8 nodes of 8 A100 with n HDR 200G
NICs per node, n in ``NICS``; the n with the lowest mean |predicted / measured - 1| is one
physical parameter of that cluster (``published_regimes.TORCHTITAN_A100_NETWORK``).  Only the
rows whose ZeRO-3 traffic outlasts the compute it hides behind (Llama 2 70B with op SAC at local
batch 1: ~11 s of gathers and reduce-scatters at 400 Gb/s per node) decide between the choices.
"""
from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_regimes as pr  # noqa: E402
import topologies  # noqa: E402
from autoplan.cost import EstimateOptions, Estimator  # noqa: E402
from autoplan.plan import Plan  # noqa: E402

NICS = (1, 2, 4, 8)


def errors(nics: int, rows: list[pr.RegimeRow]) -> list[float]:
    """predicted / published - 1 of every row on 8 nodes with ``nics`` HDR 200G NICs each."""
    cluster = dataclasses.replace(topologies.load("a100x64"), nics_per_node=nics)
    out = []
    for r in rows:
        est = Estimator(pr._model(r.model, r.seq), cluster, EstimateOptions())
        e = est.estimate(Plan.parse(r.plan, num_gpus=cluster.num_gpus), r.global_batch, detail=False)
        out.append(e.step_time_s / r.published_s - 1.0)
    return out


def main() -> int:
    rows = [r for r in pr.regime_json_rows() if r.cluster == pr.TORCHTITAN_A100]
    fits = []
    for nics in NICS:
        errs = errors(nics, rows)
        mean = sum(abs(e) for e in errs) / len(errs)
        fits.append((mean, nics))
        print(f"{nics} x HDR 200G per node ({nics * 200} Gb/s): mean |error| {mean:.1%}, max "
              f"{max(abs(e) for e in errs):.1%}  " + " ".join(f"{r.ident}:{e:+.1%}" for r, e in zip(rows, errs)),
              flush=True)
    best = min(fits)[1]
    print(f"\nfitted: nics_per_node = {best} ({best * 200} Gb/s per node); shipped: "
          f"{pr.TORCHTITAN_A100_NETWORK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
