"""``autoplan baseline``: the plan a hand-written recipe gives, and its estimate.

    autoplan baseline gpt3-175b --cluster h100x1024 --recipe megatron
    autoplan baseline mixtral-8x22b --cluster h100x512 --recipe deepseek --json
    autoplan baseline llama3-8b --cluster h100x256 --recipe llama3 --seq 131072 --global-batch 128

Recipes (``autoplan.baselines``): megatron, megascale, llama3, fsdp, deepseek, and
``published``: the layout a published run of the model used, with its source.  A recipe that
cannot apply (a dense model for deepseek, a model that fits at no pipeline depth, a batch
too small for the pipeline) says why and exits 2.  ``--json`` prints
``{recipe, model, cluster, seq, global_batch, plan, plan_string, estimate, source, credible}``
(``credible``: the recipe was written for the model's family; ``source``: where a published
layout comes from), which
``autoplan explain`` and ``autoplan export`` read as a plan file.
"""
from __future__ import annotations

import argparse
import json

from autoplan.commands.choices import SUMMARIES
from autoplan.commands.common import add_estimate_args, add_workload_args, print_estimate, run_header, wide_console


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    recipes = "; ".join(f"{k}: {v}" for k, v in SUMMARIES.items())
    p = subparsers.add_parser(
        "baseline", help="the plan a hand-written 4D recipe gives (megatron, megascale, llama3, fsdp, deepseek, "
                         "published)",
        description=f"Build the plan a hand-written recipe gives for MODEL on a cluster, and price it. {recipes}.")
    add_workload_args(p, "; raise it on big clusters where the pipeline needs more micro-batches")
    p.add_argument("--recipe", required=True, metavar="RECIPE",
                   help=f"one of: {', '.join(SUMMARIES)}")
    add_estimate_args(p)
    p.add_argument("--json", action="store_true", help="print JSON (sorted keys) instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.baselines import baseline, check_recipe, credible, published
    from autoplan.commands.common import estimate_options_from
    from autoplan.workload import Workload, load_cluster

    check_recipe(args.recipe)
    cluster = load_cluster(args.cluster)                      # bad input fails before the trace
    options = estimate_options_from(args, cluster.gpu.hbm_bytes)
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch,
                      trace_timeout_s=args.trace_timeout)
    graph, estimator = w.model, w.estimator(options)
    plan = baseline(args.recipe, graph, cluster, seq=args.seq, global_batch=args.global_batch, estimator=estimator)
    est = estimator.estimate(plan, args.global_batch)
    source = published.source(graph) if args.recipe == published.NAME else None
    fits_family = credible(args.recipe, graph)
    if args.json:
        print(json.dumps({"recipe": args.recipe, "model": args.model, "cluster": cluster.name, "seq": args.seq,
                          "global_batch": args.global_batch, "plan": plan.to_dict(),
                          "plan_string": plan.to_string(), "estimate": json.loads(est.to_json()),
                          "source": source, "credible": fits_family},
                         indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    console = wide_console()
    console.print(f"[bold]{args.recipe}[/bold] recipe for {run_header(graph, cluster, args.global_batch)}")
    console.print(f"[dim]{SUMMARIES[args.recipe]}[/dim]")
    if source:
        console.print(f"source: {source}")
    if not fits_family:
        console.print(f"[yellow]the {args.recipe} recipe was not written for this model's family: "
                      f"not a credible hand plan for it[/yellow]")
    print_estimate(console, plan, est)
    return 0
