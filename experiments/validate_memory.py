"""Price the public memory rows of ../shared/reference/regime_runs.json and compare.

    python experiments/validate_memory.py [--json] [--reserved] [--write]

Rows: every row with a published peak (``mem_gib``: torchtitan's Dec 2024 H100 T1/T3 runs) and
every ``group=memory-must-fit`` row (layouts that ran on 80 GB: they must fit).  Mapping, the same
for every row: a row whose note says "selective (op)" ran torchtitan's selective op
checkpointing, priced as ``recompute=op`` (the JSON's ``selective`` is the engine's word for
it); everything else as written.  The estimate is the peak *allocated* memory (what torch's
``MemTracker`` measures: ``autoplan memcheck``); a must-fit row must fit HBM less the whole margin.

torchtitan's figure is its device-memory monitor's peak *reserved* memory
(``torch.cuda.max_memory_reserved``), which adds the caching allocator's cached blocks.  With
``--reserved`` (and always with ``--write``) such a row is also run by ``autoplan memcheck`` at
the row's plan, the whole model on fake tensors, and the run's allocator requests are replayed
through torch's CUDA caching allocator (``costmodels.allocator``): the predicted reserved peak is
the estimate plus the replay's gap (reserved − allocated), under expandable segments, which
torchtitan's launcher sets (``run_llama_train.sh`` at 9628a18, the Dec 2024 layout:
``PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"``); the classic allocator, torch's default,
is shown beside it.  No parameter is fitted: the replay is the allocator's algorithm.  Beside it,
what the run *needs* under each allocator (``costmodels.allocator.least_capacity``: the least
device on which the replay does not run out, cached blocks released as torch releases them).

A row whose run published its configuration is priced with it (``published_regimes.RUN_SETTINGS``,
shared with the step-time regime table):

* ``ngc-nemotron4-340b-128``: NVIDIA's DGXC benchmark config (``NVIDIA/dgxc-benchmarking``
  ``nemotron/nemotron4-340b-synth.yaml`` @8f5cbb37, the 25.01 set on NeMo 24.09) runs
  ``optim.name: distributed_fused_adam`` with ``dtype: bf16, grad_sync_dtype: bf16,
  contiguous_grad_buffer: True`` -> ``state_precision=apex-dfa-bf16`` (4 + 6/d bytes per
  parameter), and ``activations_checkpoint_granularity: selective`` -> ``recompute=selective``;
  NeMo runs Megatron-Core -> ``kernels=megatron-core`` (no SwiGLU here: nothing changes).
* ``llama3-405b-8k-8192``: the Llama 3 paper §3.3.2 -- "the first model chunk on the first stage
  has only the embedding, and the last model chunk on the last stage has only output projection
  and loss calculation" after removing one layer from each: one layer per chunk, ``vpp=8``,
  ``layers=0-1x126-0``.  Its framework's kernels and its N (micro-batches per round) are not
  published: eager kernels, N = pp.

Error = predicted / published − 1.  ``--write`` puts the table into experiments/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import published_regimes as pr  # noqa: E402
from autoplan.cost import EstimateOptions, Estimator  # noqa: E402
from autoplan.plan import Plan  # noqa: E402
from results_md import write_section  # noqa: E402


def memory_rows(path: str | None = None) -> list[dict]:
    """The rows with a published peak or a must-fit outcome, with their plan mapped."""
    path = path or os.path.join(pr.REFERENCE, "regime_runs.json")
    with open(path) as f:
        raw = json.load(f)
    rows = []
    for r in raw:
        must_fit = "group=memory-must-fit" in r["note"]
        if "mem_gib" not in r and not must_fit:
            continue
        ident = r["note"].split(";")[0].split("=", 1)[1]
        fields, options = pr.run_settings(ident)
        plan = pr.with_fields(pr.engine_plan(r["plan"], r["note"], r["model"]), fields)
        cluster = r["cluster"]
        if cluster.endswith(".yaml"):
            cluster = os.path.join(os.path.dirname(path), cluster)
        rows.append({"id": ident, "model": r["model"], "cluster": cluster, "seq": r["seq"],
                     "global_batch": r["global_batch"], "plan": plan, "published_gib": r.get("mem_gib"),
                     "must_fit": must_fit, "options": options})
    return rows


RESERVED_ALLOCATOR = "expandable"      # torchtitan's launcher (module docstring)


def price(row: dict, options: EstimateOptions = EstimateOptions(), *, reserved: bool = False) -> dict:
    """The row's estimate beside its published figure; with ``reserved`` and a published
    (reserved) peak, also the allocator replay (``allocator_replays``) and the error against it."""
    options = dataclasses.replace(options, **row.get("options", {}))
    cluster = pr.cluster(row["cluster"])
    est = Estimator(pr._model(row["model"], row["seq"]), cluster, options)
    e = est.estimate(Plan.parse(row["plan"], num_gpus=cluster.num_gpus), row["global_batch"], detail=False)
    out = {"id": row["id"], "plan": e.plan, "predicted_gib": round(e.memory_gib, 2),
           "breakdown_gib": {k: round(v, 2) for k, v in e.memory_breakdown_gib.items()},
           "limit_gib": round(e.memory_limit_gib, 2), "fits": e.fits, "must_fit": row["must_fit"],
           "published_gib": row["published_gib"], "options": row.get("options", {}),
           "alive": [list(a) for a in e.activations_alive]}
    if row["published_gib"]:
        out["error"] = out["allocated_error"] = round(e.memory_gib / row["published_gib"] - 1.0, 4)
        if reserved:
            replays = allocator_replays(row, cluster)
            out["reserved"] = {name: {"gap_gib": round(r["gap_gib"], 2),
                                      "predicted_gib": round(e.memory_gib + r["gap_gib"], 2),
                                      "needs_gib": round(r["needs_gib"], 2),
                                      "allocated_gib": round(r["allocated_peak_gib"], 2)}
                               for name, r in replays.items()}
            out["predicted_reserved_gib"] = out["reserved"][RESERVED_ALLOCATOR]["predicted_gib"]
            gap = replays[RESERVED_ALLOCATOR]["gap_gib"]
            out["error"] = round((e.memory_gib + gap) / row["published_gib"] - 1.0, 4)
    return out


def allocator_replays(row: dict, cluster) -> dict[str, dict]:
    """Per allocator, ``apply.memcheck_compare.reserved_row`` of the row's plan (GiB;
    ``autoplan.apply.memcheck.measure`` with ``reserved``: rank 0, the whole model)."""
    from autoplan.apply.memcheck import measure
    from autoplan.apply.memcheck_compare import reserved_row

    plan = Plan.parse(row["plan"], num_gpus=cluster.num_gpus)
    got = measure(row["model"], plan, seq=row["seq"], global_batch=row["global_batch"], rank=0, reserved=True,
                  hbm_bytes=cluster.gpu.hbm_bytes)
    return {name: reserved_row(r, 0.0) for name, r in got["reserved"].items()}


def markdown(results: list[dict]) -> str:
    """The rows as a RESULTS.md table (GiB; limit = HBM less the margin).  A reserved row priced
    with ``reserved`` shows the allocator replay's gap under expandable segments (classic)."""
    lines = ["| row | published | estimate (allocated) | + allocator gap, expandable (classic) | predicted | error | "
             "needs under pressure, expandable (classic) | limit | fits | params / grads / optimizer / activations / "
             "other | priced plan (run settings) |", "|" + "---|" * 11]
    for r in results:
        pub = f"{r['published_gib']:.1f} (reserved)" if r["published_gib"] else "ran: must fit"
        err = f"{r['error']:+.1%}" if "error" in r else ""
        gap = predicted = needs = ""
        if "reserved" in r:
            x, c = r["reserved"]["expandable"], r["reserved"]["classic"]
            gap = f"{x['gap_gib']:.1f} ({c['gap_gib']:.1f})"
            needs = f"{x['needs_gib']:.1f} ({c['needs_gib']:.1f}) for {x['allocated_gib']:.1f} allocated"
            predicted = f"{r['predicted_reserved_gib']:.1f} (reserved)"
        elif r["published_gib"] is None:
            predicted = f"{r['predicted_gib']:.1f}"
        b = " / ".join(f"{r['breakdown_gib'][k]:.1f}" for k in ("params", "grads", "optimizer", "activations", "other"))
        opts = ", ".join(f"{k}={v}" for k, v in sorted(r["options"].items()))
        lines.append(f"| {r['id']} | {pub} | {r['predicted_gib']:.1f} | {gap} | {predicted} | {err} | {needs} | "
                     f"{r['limit_gib']:.1f} | {'yes' if r['fits'] else '**no**'} | {b} | "
                     f"`{_short(r['plan'])}`{' (' + opts + ')' if opts else ''} |")
    return "\n".join(lines) + "\n"


def _short(plan: str) -> str:
    """``plan`` with a long ``layers=`` list folded into runs (``1x126``)."""
    items = []
    for kv in plan.split(","):
        key, value = kv.split("=", 1)
        if key == "layers":
            runs: list[list[str]] = []
            for n in value.split("-"):
                if runs and runs[-1][0] == n:
                    runs[-1].append(n)
                else:
                    runs.append([n])
            value = "-".join(r[0] if len(r) == 1 else f"{r[0]}x{len(r)}" for r in runs)
        items.append(f"{key}={value}")
    return ",".join(items)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reserved", action="store_true",
                    help="replay the caching allocator on the rows with a reserved peak (memcheck, minutes)")
    ap.add_argument("--write", action="store_true",
                    help="write the table into experiments/RESULTS.md (implies --reserved)")
    args = ap.parse_args(argv)
    results = [price(r, reserved=args.reserved or args.write) for r in memory_rows()]
    if args.write:
        write_section("validate_memory", "Public memory rows (`python experiments/validate_memory.py --write`)",
                      markdown(results))
    if args.json:
        print(json.dumps(results, sort_keys=True, indent=1))
        return 0
    print(f"{'row':<26} {'published':>10} {'predicted':>10} {'error':>8} {'limit':>7}  fits  breakdown")
    for r in results:
        pub = f"{r['published_gib']:.1f}" if r["published_gib"] else ("must fit" if r["must_fit"] else "-")
        err = f"{r['error']:+.1%}" if "error" in r else ""
        b = " ".join(f"{k} {v:.1f}" for k, v in r["breakdown_gib"].items())
        predicted = r.get("predicted_reserved_gib", r["predicted_gib"])
        print(f"{r['id']:<26} {pub:>10} {predicted:>10.1f} "
              f"{err:>8} {r['limit_gib']:>7.1f}  {'yes' if r['fits'] else 'NO ':<4}  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
