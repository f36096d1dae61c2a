"""``autoplan explain``: audit a plan — primitive placement, rule verdicts, a baseline side by side.

    autoplan explain "tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective" \\
        --model gpt3-175b --cluster h100x1024 --baseline megascale
    autoplan explain plans.json --model gpt3-175b --cluster h100x1024 --format html -o report.html
    autoplan explain "tp=16,pp=4" --model gpt3-175b --cluster h100x1024 --baseline "tp=8,pp=8,vpp=3"

PLAN is a plan string or a JSON file (``autoplan search --json``: the first candidate;
``autoplan baseline --json``; ``Plan.to_json``).  ``--baseline`` is a recipe name
(megatron, megascale, llama3, fsdp, deepseek) or another plan.  Formats: md (default),
json (sorted keys), html (one self-contained file, see ``autoplan.explain.report``).
"""
from __future__ import annotations

import argparse
import os
import sys

from autoplan.commands.choices import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ
from autoplan.commands.common import add_estimate_args
from autoplan.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explain", help="audit a plan: primitive placement, rule verdicts, a baseline side by side",
        description="Explain PLAN (a plan string or a plan JSON file) on a model and cluster: every collective's "
                    "kind, group, span, calls, bytes and time; rule verdicts with evidence; and the difference "
                    "to a baseline recipe or plan.")
    p.add_argument("plan", metavar="PLAN", help="plan string, or JSON file from `autoplan search --json`")
    p.add_argument("--model", required=True, help="zoo name, family spec or model.py")
    p.add_argument("--cluster", required=True, help="cluster name, <gpu>x<N> or YAML path")
    p.add_argument("--seq", type=int, help=f"sequence length (default: the plan file's, else {DEFAULT_SEQ})")
    p.add_argument("--global-batch", type=int,
                   help=f"sequences per step (default: the plan file's, else {DEFAULT_GLOBAL_BATCH})")
    p.add_argument("--baseline", metavar="RECIPE|PLAN",
                   help="a recipe (megatron, megascale, llama3, fsdp, deepseek) or a plan string/file to compare with")
    add_estimate_args(p)
    p.add_argument("--format", choices=("md", "json", "html"), default="md", help="output format (default md)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run_values(args: argparse.Namespace) -> tuple[int, int]:
    """(seq, global batch): the flags, else the plan file's entry, else the defaults."""
    from autoplan.export.load import entry_value, read_json

    seq, batch = args.seq, args.global_batch
    if args.plan.endswith(".json") or os.path.isfile(args.plan):
        data = read_json(args.plan)
        seq = seq if seq is not None else entry_value(data, "seq")
        batch = batch if batch is not None else entry_value(data, "global_batch")
    seq = DEFAULT_SEQ if seq is None else seq
    batch = DEFAULT_GLOBAL_BATCH if batch is None else batch
    for flag, value in (("--seq", seq), ("--global-batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value!r}", f"pass {flag} N with N ≥ 1")
    return seq, batch


def parse_baseline(text: str, num_gpus: int):
    """``--baseline``: a recipe name (returned as a string) or a Plan (string or JSON file)."""
    from autoplan.baselines import RECIPES
    from autoplan.export.load import load_plan

    if text in RECIPES:
        return text
    if "=" not in text and not text.endswith(".json") and not os.path.isfile(text):
        raise UserError(f"--baseline {text!r} is neither a recipe nor a plan",
                        f"give a recipe ({', '.join(RECIPES)}), a plan string such as 'tp=8,pp=8' or a plan JSON file")
    return load_plan(text, num_gpus=num_gpus)


def run(args: argparse.Namespace) -> int:
    from autoplan.baselines import baseline
    from autoplan.commands.common import estimate_options_from
    from autoplan.explain import Side, audit, render_markdown, render_report
    from autoplan.explain.precision import precision_saving
    from autoplan.export.load import load_plan
    from autoplan.workload import Workload, load_cluster

    # everything a user can mistype is checked before the (slower) trace
    seq, global_batch = run_values(args)
    cluster = load_cluster(args.cluster)
    options = estimate_options_from(args, cluster.gpu.hbm_bytes)
    plan = load_plan(args.plan, num_gpus=cluster.num_gpus)
    wanted = parse_baseline(args.baseline, cluster.num_gpus) if args.baseline else None
    w = Workload.load(args.model, cluster, seq=seq, global_batch=global_batch,
                      trace_timeout_s=args.trace_timeout)
    graph, estimator = w.model, w.estimator(options)
    est = estimator.estimate(plan, global_batch)
    base = None
    if isinstance(wanted, str):
        bplan = baseline(wanted, graph, cluster, seq=seq, global_batch=global_batch, estimator=estimator)
        base = Side(wanted, bplan, estimator.estimate(bplan, global_batch))
    elif wanted is not None:
        base = Side("baseline", wanted, estimator.estimate(wanted, global_batch))
    if args.format == "html":
        text = render_report(args.model, cluster, [(plan, est)], estimator,
                             baseline=(base.plan, base.estimate) if base else None,
                             baseline_name=base.label if base else "baseline")
    else:
        a = audit(graph, cluster, Side("plan", plan, est), base,
                  precision=precision_saving(estimator, plan, est, global_batch))
        text = a.to_json() if args.format == "json" else render_markdown(a)
    if args.output:
        from autoplan.atomic import write_text

        write_text(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
