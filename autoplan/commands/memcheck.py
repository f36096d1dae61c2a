"""``autoplan memcheck``: the memory estimate beside torch's memory tracker on the applied plan.

    autoplan memcheck dp=8,zero=3,mbs=2,recompute=op --model llama3-8b --cluster h100x8 \\
        --seq 8192 --global-batch 16

For one rank of every rank kind (each pipeline rank; ``--pp-ranks``, by default all up to pp=4,
else the first, second, middle, last and the estimate's highest), ``autoplan.apply.memcheck``
applies the plan with autoplan's own apply path on fake tensors under torch's fake process group
at the plan's full world size and runs two training steps under ``MemTracker`` (pp > 1: that
pipeline rank's own step in the order of torch's schedule, after an untracked optimizer step);
nothing is allocated.
Printed per rank kind and category (params, grads, optimizer, activations, other): the
tracker's peak, the estimator's prediction and the difference.  A plan apply cannot run on fake
tensors (see ``autoplan.apply.memcheck.unsupported``) gets its prediction and the reason.
``--allocator classic|expandable`` also replays the run's allocator requests through torch's
CUDA caching allocator (``costmodels.allocator``; ``expandable`` is
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, as torchtitan's launcher sets it) and
prints the *reserved* peak (``torch.cuda.max_memory_reserved``, what torchtitan and most
trainers log) beside the allocated one; the model then runs whole, not cut and extrapolated.
``--layout searched`` applies the block ILP's tp layout the estimate priced (what ``autoplan run
plans.json`` runs) instead of apply's rule for a bare plan (what ``autoplan run`` runs).
``--json``: {plan, skipped, placements (with ``--layout searched``), rank_kinds: [{pp_rank, rank,
measured_gib, predicted_gib, error,
in_flight: {estimate, torch} (pp > 1: the most chunk-micro-batches alive), reserved (with
``--allocator``: {allocator, allocated_peak_gib, reserved_peak_gib, gap_gib, estimate_gib,
over_capacity, needs_gib})}]}.
"""
from __future__ import annotations

import argparse

from autoplan.commands.choices import ALLOCATORS, DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ
from autoplan.commands.common import add_margin_arg
from autoplan.errors import UserError

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
MAX_GPUS = 16_384     # h100x16384 (llama3-405b's run): ~8 s on 2 cores; h100x100000 ran past 100 s with no output


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("memcheck", help="memory estimate vs torch's memory tracker on the applied plan",
                              description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", metavar="PLAN", help="plan string or a plan JSON file")
    p.add_argument("--model", required=True, help="zoo name, family spec or model.py")
    p.add_argument("--cluster", required=True, help="cluster name, <gpu>x<N> or YAML path")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    p.add_argument("--global-batch", type=int, default=DEFAULT_GLOBAL_BATCH,
                   help=f"sequences per optimizer step (default {DEFAULT_GLOBAL_BATCH})")
    p.add_argument("--pp-ranks", metavar="LIST", default=None,
                   help="pipeline ranks to run, comma-separated (default: all up to pp=4, else the first, second, "
                        "middle, last and the one the estimate puts highest)")
    p.add_argument("--layout", choices=("rule", "searched"), default="rule",
                   help="tp placements to apply: rule (apply's Megatron-style rule, as `autoplan run` runs a bare "
                        "plan) or searched (the block ILP's layout the estimate priced, as `autoplan run plans.json` "
                        "runs a search result)")
    p.add_argument("--allocator", choices=ALLOCATORS, default=None,
                   help="also replay torch's CUDA caching allocator over the run and report reserved memory: "
                        "classic (torch's default) or expandable (expandable_segments:True, torchtitan's launcher); "
                        "runs the whole model")
    add_margin_arg(p)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from autoplan.apply.memcheck_compare import compare
    from autoplan.commands.common import memory_margin
    from autoplan.cost import rounded
    from autoplan.export.load import load_plan
    from autoplan.workload import Workload, load_cluster

    cluster = load_cluster(args.cluster)
    if cluster.num_gpus > MAX_GPUS:
        raise UserError(f"memcheck runs the plan under a fake process group of the whole world size: "
                        f"{cluster.num_gpus:,} GPUs is more than it measures in reasonable time ({MAX_GPUS:,})",
                        f"memcheck the plan on a cluster of at most {MAX_GPUS:,} GPUs with the same tp, cp, pp and "
                        f"ep (a rank's memory depends on dp only through ZeRO's sharding), e.g. --cluster "
                        f"{cluster.gpu.name}x{MAX_GPUS}")
    margin = memory_margin(args, cluster.gpu.hbm_bytes)
    plan = load_plan(args.plan, num_gpus=cluster.num_gpus)
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch,
                      trace_timeout_s=args.trace_timeout)
    result = compare(w, args.model, plan, seq=args.seq, global_batch=args.global_batch, margin_gib=margin,
                     pp_ranks=args.pp_ranks, allocator=args.allocator, layout=args.layout)
    if args.json:
        print(json.dumps(rounded(result), sort_keys=True))
        return 0
    _print(w, cluster, args, result)
    return 0


def _print(w, cluster, args, result: dict) -> None:
    from autoplan.commands.common import wide_console

    console = wide_console()
    console.print(f"{w.model.model.name} on {cluster.name}, seq {args.seq:,}, global batch {args.global_batch:,}: "
                  f"[bold cyan]{result['plan']}[/bold cyan]")
    if result["skipped"]:
        console.print(f"[yellow]not measured[/yellow]: apply cannot run this plan on fake tensors: {result['skipped']}")
    rows = result["rank_kinds"]
    for row in rows:
        if row["measured_gib"] is None and len(rows) > 1 and not result["skipped"]:
            continue
        console.print(_rank_table(row))
        if row["error"] is not None:
            steps = "one step after an optimizer step" if len(rows) > 1 else "two steps"
            console.print(f"estimate / tracker − 1 = {row['error']:+.1%} (tracker: allocations of one rank on fake "
                          f"tensors, {steps}; limit {result['memory_limit_gib']:.1f} GiB)")
        if row["reserved"] is not None:
            r = row["reserved"]
            console.print(f"reserved ({r['allocator']} caching allocator replayed over the run): "
                          f"{r['reserved_peak_gib']:.2f} GiB peak, {r['gap_gib']:.2f} above the allocated "
                          f"{r['allocated_peak_gib']:.2f}; the estimate carried to reserved: "
                          f"{r['estimate_gib']:.2f} GiB"
                          + (" [yellow](past HBM: the allocator would free cached blocks and retry)[/yellow]"
                             if r["over_capacity"] else ""))
            console.print(f"needs {r['needs_gib']:.2f} GiB of device memory under that allocator "
                          f"({r['needs_gib'] - r['allocated_peak_gib']:+.2f} beyond the allocated peak: "
                          f"the least device "
                          f"the replay does not run out on; {cluster.gpu.hbm_bytes / 2 ** 30:.1f} GiB here, of which "
                          f"the CUDA context and NCCL take some outside the allocator)")
        if row["in_flight"] and row["in_flight"]["torch"] is not None:
            console.print(f"chunk-micro-batches in flight at most: torch's order {row['in_flight']['torch']}, "
                          f"the estimate's peak {row['in_flight']['estimate']}")
    rest = [r for r in rows if r["measured_gib"] is None]
    if rest and len(rest) < len(rows):
        console.print("estimate only (not run; --pp-ranks): " + ", ".join(
            f"rank {r['pp_rank']} {r['predicted_gib']['total']:.1f}" for r in rest) + " GiB")
    if len(rows) > 1 and len(rest) < len(rows):
        console.print("pp > 1: each pipeline rank's own step in the order of torch's schedule (pipeline_order), "
                      "stages whole (no layer extrapolation), stage inputs and output gradients fresh fake tensors")


def _rank_table(row: dict):
    """One pipeline rank's tracker peak beside the estimate, by category."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, title=f"pipeline rank {row['pp_rank']} (global rank {row['rank']}), GiB")
    for col in ("category", "tracker peak", "estimate", "difference"):
        table.add_column(col, justify="left" if col == "category" else "right")
    measured, predicted = row["measured_gib"], row["predicted_gib"]
    for cat in (*CATEGORIES, "total"):
        got = measured.get(cat) if measured else None
        want = predicted.get(cat)
        diff = f"{want - got:+.2f}" if got is not None and want is not None else ""
        table.add_row(cat, f"{got:.2f}" if got is not None else "-", f"{want:.2f}" if want is not None else "-", diff)
    return table
