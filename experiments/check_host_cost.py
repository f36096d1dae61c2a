"""Does any public source besides vTrain constrain the eager stack's host cost?  (issue 38)

    python experiments/check_host_cost.py [--json]

``--cv`` (``cross_validation.py``) warns that ``stack.host_floor_s`` (host seconds per launched
op) and ``stack.overhead_s`` (GPU seconds per kernel beyond its HBM traffic) of
``a100-megatron-deepspeed.yaml`` are decided by vTrain's rows alone.  This script prints the
evidence for or against a second source, on the same rows and pricing as ``--cv``:

1. **vTrain split** (the 240 ``--cv`` rows): a row is *host-bound* where the shipped host floor
   moves its price by more than 2 % (``classify``), *GPU-bound* where it moves it by under
   0.1 %; per class the mean |error| shipped, with the host floor at its prior (0) and with
   the per-kernel time at its prior (``a100.yaml``'s 4 µs).  Which parameter each class reads.
2. **Binding floor** of every other public source: each row priced with a host floor F on its
   own profile (A100, H100 or B200), F over ``FLOORS``; the smallest F at which one of the
   source's rows moves by 1 % or more.  A source whose binding floor is above the fitted
   55 µs cannot constrain it.
3. **Per-kernel time** ``overhead_s`` over ``OVERHEADS`` on the A100 and H100 profiles, mean and
   signed error per source: which eager rows would share a per-kernel cost, and which reject it.
4. **llm-foundry's attention**: per BF16 row, the model's attention share a of step time and
   the attention slowdown f that alone closes the row's error e (``attention_slowdown``:
   (1 − a) + a·f = 1 / (1 + e)); the 512-token rows' error left at the long rows' mean f
   (``left_after``).
5. **vTrain's own sensitivity**: its mean |error| over a (per-kernel time, host floor) grid
   (``GRID``): how tightly its rows alone pin each value.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cross_validation as cv  # noqa: E402
import published_regimes as pr  # noqa: E402
from autoplan.cost import Estimator  # noqa: E402
from autoplan.plan import Plan  # noqa: E402

FLOORS = (25e-6, 55e-6, 100e-6, 200e-6, 400e-6)
OVERHEADS = (4e-6, 15e-6, 30e-6)
HOST_BOUND, PARTLY = 0.02, 0.001
"""A vTrain row is host-bound where the shipped floor moves its price by more than 2 %, GPU-bound
where by under 0.1 %, partly host-bound in between."""
GRID = ((4e-6, 0.0), (4e-6, 25e-6), (4e-6, 40e-6), (4e-6, 55e-6), (4e-6, 70e-6),
        (30e-6, 0.0), (30e-6, 40e-6), (30e-6, 55e-6), (30e-6, 70e-6), (34e-6, 0.0))
"""(``stack.overhead_s``, ``stack.host_floor_s``) points of section 5: the priors (4 µs, 0), the
fitted (30 µs, 55 µs) and their neighbours."""
OTHER_PROFILES = ("a100", "h100", "b200")
MOE_SOURCES = ("mcore-zoo", "megatron-bridge")
MOE_NOTE = " (MoE layers: floor max(host_floor_s, moe_host_floor_s = 30 µs))"


def classify(host_share: float) -> str:
    """``host-bound``, ``partly`` or ``GPU-bound``: how much the host floor lengthens a row
    (price with the floor / price without − 1)."""
    return "host-bound" if host_share > HOST_BOUND else "partly" if host_share > PARTLY else "GPU-bound"


def attention_slowdown(error: float, share: float) -> float:
    """The factor f on the attention kernels' seconds that alone closes a row priced ``error``
    (predicted / measured − 1) with attention ``share`` of its step: (1 − a) + a·f = 1/(1 + e)."""
    return 1.0 + (1.0 / (1.0 + error) - 1.0) / share


def left_after(error: float, share: float, slowdown: float) -> float:
    """A row's error once its attention takes ``slowdown`` × its seconds: (1 + e)·(1 + a·(f − 1)) − 1."""
    return (1.0 + error) * (1.0 + share * (slowdown - 1.0)) - 1.0


def _with(profiles: dict[str, str], kinds: tuple[str, ...], fields: dict[str, float]) -> dict[str, str]:
    return profiles | {k: cv._profile_file(profiles[k], fields) for k in kinds}


def _mean(errs: list[float]) -> float:
    return sum(abs(e) for e in errs) / len(errs) if errs else float("nan")


def vtrain_split() -> dict[str, dict[str, float]]:
    """Section 1: per class of vTrain row, its rows and mean |error| shipped, floor 0, per-kernel 4 µs."""
    rows = [c for c in cv.cases() if c.source == "vtrain"]
    shipped = cv.price(rows, cv.SHIPPED)
    floor0 = cv.price(rows, cv.SHIPPED | {"stack.host_floor_s": 0.0})
    kernel4 = cv.price(rows, cv.SHIPPED | {"stack.overhead_s": cv.PARAMETERS["stack.overhead_s"].prior})
    out: dict[str, dict[str, float]] = {}
    for a, b, c in zip(shipped, floor0, kernel4):
        if a.predicted_s is None or b.predicted_s is None or a.error is None:
            continue
        cls = out.setdefault(classify(a.predicted_s / b.predicted_s - 1.0),
                             {"rows": 0, "shipped": 0.0, "floor_0": 0.0, "kernel_4us": 0.0, "max": 0.0})
        cls["rows"] += 1
        cls["shipped"] += abs(a.error)
        cls["floor_0"] += abs(b.error or 0.0)
        cls["kernel_4us"] += abs(c.error or 0.0)
        cls["max"] = max(cls["max"], abs(a.error))
    for cls in out.values():
        for k in ("shipped", "floor_0", "kernel_4us"):
            cls[k] /= cls["rows"]
    return out


def binding_floors() -> dict[str, float | None]:
    """Section 2: per source other than vTrain, the smallest floor of ``FLOORS`` at which one of
    its rows moves by 1 % or more (None: none up to the largest)."""
    rows = [c for c in cv.cases() if c.source != "vtrain"]
    base = cv._profiles(cv.SHIPPED)
    nominal = {r.case.ident: r.predicted_s for r in cv.price_with_profiles(rows, base)}
    out: dict[str, float | None] = {c.source: None for c in rows}
    for floor in FLOORS:
        for r in cv.price_with_profiles(rows, _with(base, OTHER_PROFILES, {"host_floor_s": floor})):
            before = nominal[r.case.ident]
            if before is None or r.predicted_s is None or out[r.case.source] is not None:
                continue
            if abs(r.predicted_s / before - 1.0) >= 0.01:
                out[r.case.source] = floor
    return dict(sorted(out.items()))


def overhead_sweep(sources: tuple[str, ...]) -> dict[str, dict[float, tuple[float, float]]]:
    """Section 3: per source, per per-kernel time of ``OVERHEADS`` on the A100 and H100 profiles,
    (mean |error|, mean signed error)."""
    rows = [c for c in cv.cases() if c.source in sources]
    base = cv._profiles(cv.SHIPPED)
    out: dict[str, dict[float, tuple[float, float]]] = {s: {} for s in sources}
    for overhead in OVERHEADS:
        results = cv.price_with_profiles(rows, _with(base, ("a100", "h100"), {"overhead_s": overhead}))
        for s in sources:
            errs = [r.error for r in results if r.case.source == s and r.error is not None]
            out[s][overhead] = (_mean(errs), sum(errs) / len(errs))
    return out


def attention_shares() -> list[tuple[str, int, float, float]]:
    """Section 4: (row, seq, error, attention share of step time) of llm-foundry's BF16 rows as
    ``--cv`` prices them."""
    profiles = cv._profiles(cv.SHIPPED)
    out = []
    for c in cv.cases():
        row = c.row
        if c.source != "llm-foundry" or not isinstance(row, pr.RegimeRow) or "precision=" in row.plan:
            continue
        machines = pr.cluster(row.cluster)
        est = Estimator(pr._model(row.model, row.seq), machines, cv._regime_options(row, profiles))
        e = est.estimate(Plan.parse(row.plan, num_gpus=machines.num_gpus), row.global_batch, detail=True)
        out.append((c.ident, row.seq, e.step_time_s / c.published_s - 1.0, e.attention_time_share))
    return out


def vtrain_grid() -> dict[str, float]:
    """Section 5: vTrain's mean |error| (its ``--cv`` rows) at each (per-kernel time, host floor)
    of ``GRID``: how sharply its rows alone pin each value."""
    rows = [c for c in cv.cases() if c.source == "vtrain"]
    out = {}
    for overhead, floor in GRID:
        point = cv.SHIPPED | {"stack.overhead_s": overhead, "stack.host_floor_s": floor}
        out[f"{overhead * 1e6:g}us/{floor * 1e6:g}us"] = cv.mean_abs(cv.price(rows, point))
    return out


def report() -> dict:
    attention = attention_shares()
    long = [attention_slowdown(e, a) for _, seq, e, a in attention if seq > 512]
    f = sum(long) / len(long)
    return {"vtrain_split": vtrain_split(), "binding_floor_s": binding_floors(),
            "overhead": {s: {f"{o * 1e6:g}us": v for o, v in d.items()}
                         for s, d in overhead_sweep(("zero-bubble", "torchtitan-a100", "torchtitan-h100",
                                                     "llm-foundry", "fp8-lm")).items()},
            "llm_foundry_attention": [{"row": i, "error": e, "share": a, "slowdown": attention_slowdown(e, a),
                                       "left_at_mean_slowdown": left_after(e, a, f)} for i, _, e, a in attention],
            "mean_long_row_slowdown": f, "vtrain_grid": vtrain_grid()}


def markdown(r: dict) -> str:
    lines = ["| vTrain rows | rows | mean \\|e\\| shipped | host floor 0 | per-kernel 4 µs | max shipped |",
             "|---|---|---|---|---|---|"]
    for cls, v in sorted(r["vtrain_split"].items()):
        lines.append(f"| {cls} | {v['rows']} | {v['shipped']:.1%} | {v['floor_0']:.1%} | {v['kernel_4us']:.1%} | "
                     f"{v['max']:.1%} |")
    lines += ["", "| source | smallest host floor that moves a row ≥ 1 % |", "|---|---|"]
    lines += [f"| {s} | {'> 400 µs' if f is None else f'{f * 1e6:g} µs'}{MOE_NOTE if s in MOE_SOURCES else ''} |"
              for s, f in r["binding_floor_s"].items()]
    heads = " | ".join(f"{o * 1e6:g} µs" for o in OVERHEADS)
    lines += ["", f"| source (A100/H100 per-kernel time) | {heads} |", "|---|" + "---|" * len(OVERHEADS)]
    for s, d in r["overhead"].items():
        lines.append(f"| {s} | " + " | ".join(f"{m:.1%} ({sg:+.1%})" for m, sg in d.values()) + " |")
    lines += ["", "| llm-foundry BF16 row | error | attention share | slowdown that closes it | "
              f"left at the long rows' mean {r['mean_long_row_slowdown']:.2f} |", "|---|---|---|---|---|"]
    lines += [f"| {a['row']} | {a['error']:+.1%} | {a['share']:.3f} | {a['slowdown']:.2f} | "
              f"{a['left_at_mean_slowdown']:+.1%} |" for a in r["llm_foundry_attention"]]
    lines += ["", "| vTrain (per-kernel time / host floor) | " + " | ".join(r["vtrain_grid"]) + " |",
              "|---|" + "---|" * len(r["vtrain_grid"]),
              "| mean \\|e\\| | " + " | ".join(f"{v:.1%}" for v in r["vtrain_grid"].values()) + " |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    r = report()
    print(json.dumps(r, indent=1, sort_keys=True, default=str) if args.json else markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
