"""``autoplan baseline``: the plan a hand-written recipe gives, and its estimate.

    autoplan baseline gpt3-175b --cluster h100x1024 --recipe megatron
    autoplan baseline mixtral-8x22b --cluster h100x512 --recipe deepseek --json
    autoplan baseline llama3-8b --cluster h100x256 --recipe llama3 --seq 131072 --global-batch 128

Recipes (``autoplan.baselines``): megatron, megascale, llama3, fsdp, deepseek.  A recipe that
cannot apply (a dense model for deepseek, a model that fits at no pipeline depth, a batch
too small for the pipeline) says why and exits 2.  ``--json`` prints
``{recipe, model, cluster, seq, global_batch, plan, plan_string, estimate}``, which
``autoplan explain`` and ``autoplan export`` read as a plan file.

Also home of ``prepare`` (trace + cluster + Estimator) and ``print_estimate`` (rich tables),
which ``autoplan explain`` shares.
"""
from __future__ import annotations

import argparse
import json

from autoplan.errors import UserError

DEFAULT_SEQ = 2048
DEFAULT_GLOBAL_BATCH = 1024


def add_workload_args(p: argparse.ArgumentParser, batch_note: str = "") -> None:
    """MODEL, --cluster, --seq and --global-batch: what every pricing command is about."""
    p.add_argument("model", metavar="MODEL", help="zoo name, family spec or model.py")
    p.add_argument("--cluster", required=True, help="cluster name, <gpu>x<N> or YAML path")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    p.add_argument("--global-batch", type=int, default=DEFAULT_GLOBAL_BATCH,
                   help=f"sequences per optimizer step (default {DEFAULT_GLOBAL_BATCH}{batch_note})")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from autoplan.baselines import SUMMARIES

    recipes = "; ".join(f"{k}: {v}" for k, v in SUMMARIES.items())
    p = subparsers.add_parser(
        "baseline", help="the plan a hand-written 4D recipe gives (megatron, megascale, llama3, fsdp, deepseek)",
        description=f"Build the plan a hand-written recipe gives for MODEL on a cluster, and price it. {recipes}.")
    add_workload_args(p, "; raise it on big clusters where the pipeline needs more micro-batches")
    p.add_argument("--recipe", required=True, metavar="RECIPE",
                   help=f"one of: {', '.join(SUMMARIES)}")
    p.add_argument("--json", action="store_true", help="print JSON (sorted keys) instead of tables")
    p.set_defaults(func=run)


def prepare(model: str, cluster, seq: int, global_batch: int):
    """(BlockGraph traced at ``seq``, Cluster, Estimator); ``cluster`` is a Cluster or a name.
    UserError on bad input."""
    from autoplan.commands.clusters import load_cluster
    from autoplan.cost import Estimator
    from autoplan.frontend import trace

    if global_batch < 1:
        raise UserError(f"--global-batch must be ≥ 1, got {global_batch}", "pass --global-batch N with N ≥ 1")
    c = load_cluster(cluster) if isinstance(cluster, str) else cluster
    graph = trace(model, seq=seq)
    return graph, c, Estimator(graph, c)


def run(args: argparse.Namespace) -> int:
    from autoplan.baselines import SUMMARIES, baseline, check_recipe
    from autoplan.baselines.common import price

    from autoplan.commands.clusters import load_cluster

    check_recipe(args.recipe)
    cluster = load_cluster(args.cluster)          # bad names fail before the trace
    graph, cluster, estimator = prepare(args.model, cluster, args.seq, args.global_batch)
    plan = baseline(args.recipe, graph, cluster, seq=args.seq, global_batch=args.global_batch, estimator=estimator)
    est = price(estimator, plan, args.global_batch)
    if args.json:
        print(json.dumps({"recipe": args.recipe, "model": args.model, "cluster": cluster.name, "seq": args.seq,
                          "global_batch": args.global_batch, "plan": plan.to_dict(),
                          "plan_string": plan.to_string(), "estimate": json.loads(est.to_json())},
                         indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    console = wide_console()
    console.print(f"[bold]{args.recipe}[/bold] recipe for {graph.model.name} on {cluster.name} "
                  f"({cluster.describe()}), seq {args.seq:,}, global batch {args.global_batch:,}")
    console.print(f"[dim]{SUMMARIES[args.recipe]}[/dim]")
    print_estimate(console, plan, est)
    return 0


def wide_console():
    """A rich Console; when stdout is not a terminal (a pipe, a file), 200 columns wide so
    that plan strings and tables are not wrapped at 80."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_estimate(console, plan, est, title: str = "") -> None:
    """The plan, its headline numbers and its primitive placement as rich tables."""
    from rich import box
    from rich.table import Table

    from autoplan.explain.audit import shown
    from autoplan.explain.units import AXIS_NAMES, KIND_NAMES, count, percent, seconds, size

    console.print(f"{title + ': ' if title else ''}[bold cyan]{plan.to_string()}[/bold cyan]")
    head = Table(box=box.SIMPLE_HEAD, show_header=True)
    for col in ("step", "tokens/s", "MFU", "HFU", "memory GiB", "fits", "bubble", "comm", "comm exposed"):
        head.add_column(col, justify="right")
    head.add_row(seconds(est.step_time_s), f"{est.tokens_per_s:,.0f}", percent(est.mfu), percent(est.hfu),
                 f"{est.memory_gib:.1f} / {est.hbm_gib:.1f}", "yes" if est.fits else "[red]no[/red]",
                 percent(est.bubble_fraction), seconds(est.comm_time_s), seconds(est.comm_exposed_s))
    console.print(head)
    prims = Table(title="Primitive placement (per step, busiest pipeline rank)", box=box.SIMPLE_HEAD)
    for col in ("primitive", "dim", "group", "span", "calls/step", "bytes/call", "time/step", "exposed"):
        prims.add_column(col, justify="right" if col in ("group", "calls/step", "bytes/call", "time/step",
                                                         "exposed") else "left")
    for p in shown(est.primitives):
        prims.add_row(KIND_NAMES.get(p.kind, p.kind), AXIS_NAMES.get(p.dim, p.dim), str(p.group_size), p.span,
                      count(p.calls_per_step), size(p.bytes_per_call), seconds(p.time_s), seconds(p.exposed_s))
    console.print(prims)
    for v in est.violations:
        console.print(f"[red]violation[/red] {v.rule}: {v.text}")
