"""``autoplan export``: a plan as a torchtitan TOML fragment, Megatron-LM arguments, or JSON.

    autoplan export "tp=8,pp=8,dp=16,vpp=3,schedule=interleaved" --to megatron --model gpt3-175b
    autoplan export plans.json --to torchtitan --model llama3-70b --global-batch 1536 --seq 4096
    autoplan export "tp=4,pp=2" --to json -o plan.json

PLAN is a plan string or a JSON file (``autoplan search --json`` output: the first
candidate; or ``Plan.to_json``).  What the engine cannot express (uneven cuts, a
schedule it lacks, per-stage recompute, ...) is listed on stderr as warnings.
"""
from __future__ import annotations

import argparse
import os
import sys

from autoplan.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a plan as torchtitan TOML, Megatron-LM arguments or JSON",
        description="Write PLAN (a plan string or a plan JSON file) in another engine's configuration "
                    "language; warn on stderr about what that engine cannot express.")
    p.add_argument("plan", metavar="PLAN", help="plan string, or JSON file from `autoplan search --json`")
    p.add_argument("--to", required=True, choices=("torchtitan", "megatron", "json"), help="target engine")
    p.add_argument("--model", help="zoo name, family spec or model.py: pins the layer count (stage cuts)")
    p.add_argument("--global-batch", type=int, help="sequences per step (batch-size keys)")
    p.add_argument("--seq", type=int, help="sequence length")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.export import export
    from autoplan.export.load import entry_value, load_plan, read_json

    plan = load_plan(args.plan)
    global_batch, seq = args.global_batch, args.seq
    if args.plan.endswith(".json") or os.path.isfile(args.plan):
        data = read_json(args.plan)
        global_batch = global_batch if global_batch is not None else entry_value(data, "global_batch")
        seq = seq if seq is not None else entry_value(data, "seq")
    for flag, value in (("--global-batch", global_batch), ("--seq", seq)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UserError(f"{flag} must be a positive integer, got {value!r}", f"pass {flag} N with N ≥ 1")
    num_layers = model_layers(args.model) if args.model else None
    check(plan, num_layers, global_batch)
    result = export(plan, args.to, num_layers=num_layers, global_batch=global_batch, seq=seq)
    for warning in result.warnings:
        print(f"warning: {result.engine} cannot express the plan exactly: {warning}", file=sys.stderr)
    if args.output:
        from autoplan.atomic import write_text

        write_text(args.output, result.text)
    else:
        sys.stdout.write(result.text)
    return 0


def model_layers(model: str) -> int:
    """Number of blocks of a model (zoo/spec: from its config; a file: built on the meta device)."""
    from autoplan.apply.layout import count_blocks

    return count_blocks(model)


def check(plan, num_layers: int | None, global_batch: int | None) -> None:
    """The plan/model/batch conflicts an export would silently carry."""
    if num_layers is not None:
        plan.check_layers(num_layers)
    if global_batch is not None:
        plan.check_batch(global_batch)
