"""``autoplan memcheck``: the memory estimate beside torch's memory tracker on the applied plan.

    autoplan memcheck dp=8,zero=3,mbs=2,recompute=op --model llama3-8b --cluster h100x8 \\
        --seq 8192 --global-batch 16

For one rank of every rank kind (each pipeline rank), ``autoplan.apply.memcheck`` applies the
plan with autoplan's own apply path on fake tensors under torch's fake process group at the
plan's full world size and runs two training steps under ``MemTracker``; nothing is allocated.
Printed per rank kind and category (params, grads, optimizer, activations, other): the
tracker's peak, the estimator's prediction and the difference.  A plan apply cannot run on fake
tensors (see ``autoplan.apply.memcheck.unsupported``) gets its prediction and the reason.
``--json``: {plan, skipped, rank_kinds: [{pp_rank, rank, measured_gib, predicted_gib, error}]}.
"""
from __future__ import annotations

import argparse

from autoplan.commands.common import add_margin_arg
from autoplan.workload import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")


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
    add_margin_arg(p)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from autoplan.apply.memcheck import GIB, measure, rank_kinds, unsupported
    from autoplan.commands.common import memory_margin
    from autoplan.cost import EstimateOptions, rounded
    from autoplan.export.load import load_plan
    from autoplan.workload import Workload, load_cluster

    cluster = load_cluster(args.cluster)
    margin = memory_margin(args, cluster.gpu.hbm_bytes)
    plan = load_plan(args.plan, num_gpus=cluster.num_gpus)
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch)
    est = w.estimator(EstimateOptions(memory_margin_gib=margin)).estimate(plan, args.global_batch, detail=False)
    skipped = unsupported(plan)
    kinds = []
    for pp_rank, rank in enumerate(rank_kinds(plan)):
        predicted = dict(est.memory_breakdown_gib) if plan.pp == 1 else {}
        predicted["total"] = est.memory_per_stage_gib[pp_rank]
        row = {"pp_rank": pp_rank, "rank": rank, "predicted_gib": predicted, "measured_gib": None, "error": None}
        if skipped is None:
            got = measure(args.model, plan, seq=args.seq, global_batch=args.global_batch, rank=rank)
            row["measured_gib"] = {k: v / GIB for k, v in got.items()}
            row["error"] = predicted["total"] / row["measured_gib"]["total"] - 1.0
        kinds.append(row)
    result = {"plan": plan.to_string(), "skipped": skipped, "rank_kinds": kinds,
              "memory_limit_gib": est.memory_limit_gib}
    if args.json:
        print(json.dumps(rounded(result), sort_keys=True))
        return 0
    _print(w, cluster, args, result)
    return 0


def _print(w, cluster, args, result: dict) -> None:
    from rich import box
    from rich.table import Table

    from autoplan.commands.common import wide_console

    console = wide_console()
    console.print(f"{w.model.model.name} on {cluster.name}, seq {args.seq:,}, global batch {args.global_batch:,}: "
                  f"[bold cyan]{result['plan']}[/bold cyan]")
    if result["skipped"]:
        console.print(f"[yellow]not measured[/yellow]: apply cannot run this plan on fake tensors: {result['skipped']}")
    for row in result["rank_kinds"]:
        table = Table(box=box.SIMPLE_HEAD, title=f"pipeline rank {row['pp_rank']} (global rank {row['rank']}), GiB")
        for col in ("category", "tracker peak", "estimate", "difference"):
            table.add_column(col, justify="left" if col == "category" else "right")
        measured, predicted = row["measured_gib"], row["predicted_gib"]
        for cat in (*CATEGORIES, "total"):
            if cat not in predicted and not measured:
                continue
            got = measured.get(cat) if measured else None
            want = predicted.get(cat)
            diff = f"{want - got:+.2f}" if got is not None and want is not None else ""
            table.add_row(cat, f"{got:.2f}" if got is not None else "-", f"{want:.2f}" if want is not None else "-",
                          diff)
        console.print(table)
        if row["error"] is not None:
            console.print(f"estimate / tracker − 1 = {row['error']:+.1%} (tracker: allocations of one rank on fake "
                          f"tensors, two steps; limit {result['memory_limit_gib']:.1f} GiB)")
