"""``autoplan export``: a plan as torchtitan 0.3.0 arguments (or a 0.2.x TOML fragment),
Megatron-LM arguments, or JSON.

    autoplan export "tp=8,pp=8,dp=16,vpp=3,schedule=interleaved" --to megatron --model gpt3-175b
    autoplan export plans.json --to torchtitan --model llama3-70b --global-batch 1536 --seq 4096 -o args.txt
    autoplan export plans.json --to torchtitan@0.2 --model llama3-70b      # torchtitan 0.2.x TOML
    autoplan export "tp=4,pp=2" --to json -o plan.json

PLAN is a plan string or a JSON file (``autoplan search --json`` output: the first
candidate; or ``Plan.to_json``).  What the engine cannot express (uneven cuts, a
schedule it lacks, per-stage recompute, ...) is listed on stderr as warnings.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.errors import UserError

if TYPE_CHECKING:                 # autoplan.export imports numpy (via the plan), which `export --help` avoids
    from autoplan.export.base import Architecture


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a plan as torchtitan 0.3.0 arguments, Megatron-LM arguments or JSON",
        description="Write PLAN (a plan string or a plan JSON file) in another engine's configuration "
                    "language; warn on stderr about what that engine cannot express. Targets: torchtitan = "
                    "torchtitan 0.3.0's command line (--module M --config C and overrides, as "
                    "torchtitan.config.ConfigManager().parse_args takes them; -o writes one argument per "
                    "line); torchtitan@0.2 = torchtitan 0.2.x's TOML job config (0.2.2); megatron = "
                    "Megatron-LM arguments (megatron/training/arguments.py @ d98e8a64ddf3); json = the plan.")
    p.add_argument("plan", metavar="PLAN", help="plan string, or JSON file from `autoplan search --json`")
    p.add_argument("--to", required=True, choices=("torchtitan", "torchtitan@0.2", "megatron", "json"),
                   help="target engine: torchtitan (0.3.0), torchtitan@0.2 (0.2.x TOML), megatron, json")
    p.add_argument("--model", help="zoo name, family spec or model.py: pins the layer count (stage cuts); "
                                   "a zoo name torchtitan ships also picks its --module/--config")
    p.add_argument("--cluster", help="cluster name or YAML: its NVLink domain fixes a USP plan's Ulysses × ring "
                                     "split for Megatron (default: 8-GPU domains)")
    p.add_argument("--global-batch", type=int, help="sequences per step (batch-size keys)")
    p.add_argument("--seq", type=int, help="sequence length")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.export import export
    from autoplan.export.base import PLAIN
    from autoplan.export.load import entry_value, load_plan, read_json

    plan = load_plan(args.plan)
    global_batch, seq = args.global_batch, args.seq
    if args.plan.endswith(".json") or os.path.isfile(args.plan):
        data = read_json(args.plan)
        global_batch = global_batch if global_batch is not None else searched_batch(data, plan)
        seq = seq if seq is not None else entry_value(data, "seq")
    for flag, value in (("--global-batch", global_batch), ("--seq", seq)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UserError(f"{flag} must be a positive integer, got {value!r}", f"pass {flag} N with N ≥ 1")
    shape = model_shape(args.model, args.trace_timeout) if args.model else None
    check(plan, shape, global_batch, seq)
    num_layers = shape.layers if shape else None
    nvlink_domain = None
    if args.cluster:
        from autoplan.workload import load_cluster

        nvlink_domain = load_cluster(args.cluster).nvlink_domain
    result = export(plan, args.to, num_layers=num_layers, global_batch=global_batch, seq=seq, model=args.model,
                    nvlink_domain=nvlink_domain, arch=shape.arch if shape and shape.arch else PLAIN)
    for warning in result.warnings:
        print(f"warning: {result.engine} cannot express the plan exactly: {warning}", file=sys.stderr)
    if args.output:
        from autoplan.atomic import write_text

        write_text(args.output, result.text if result.argv is None else "".join(a + "\n" for a in result.argv))
    else:
        sys.stdout.write(result.text)
    return 0


def searched_batch(data, plan) -> int | None:
    """The global batch of a search result entry: its own ``global_batch``, else micro-batches × dp × mbs
    (``microbatches`` is B / (dp·mbs) by definition)."""
    from autoplan.export.load import entry_value

    batch = entry_value(data, "global_batch")
    microbatches = entry_value(data, "microbatches")
    if batch is None and isinstance(microbatches, int) and not isinstance(microbatches, bool) and microbatches > 0:
        return microbatches * plan.dp * plan.mbs
    return batch


@dataclass(frozen=True)
class ModelShape:
    """What an export checks a plan against (0: not known for this model)."""

    layers: int
    heads: int = 0
    kv_heads: int = 0
    experts: int = 0
    arch: Architecture | None = None      # None: a plain transformer (export.base.PLAIN)


def model_shape(model: str, timeout_s: float) -> ModelShape:
    """The blocks of a model (zoo/spec: from its config; a file: built on the meta device) and,
    from a config, its heads and experts."""
    from autoplan.apply.layout import count_blocks
    from autoplan.export.base import Architecture
    from autoplan.frontend.source import load_source

    layers = count_blocks(model, timeout_s)
    info = load_source(model).info          # a file: imported once already, by count_blocks
    if info is None:
        return ModelShape(layers)
    return ModelShape(layers, info.heads, info.kv_heads, info.experts, Architecture.of(info))


def check(plan, shape: ModelShape | None, global_batch: int | None, seq: int | None) -> None:
    """The plan/model/batch conflicts an export would silently carry (``Plan.validate``'s, less
    the cluster's and the pipeline's micro-batch counts)."""
    plan.check_shape()
    if shape is not None:
        plan.check_layers(shape.layers)
        _check_model(plan, shape)
    if global_batch is not None:
        plan.check_batch(global_batch)
    if seq is not None and seq % plan.cp:
        raise UserError(f"bad plan: cp={plan.cp} does not divide the sequence length {seq}",
                        "pick cp dividing the sequence length")


def _check_model(plan, shape: ModelShape) -> None:
    if shape.heads and shape.heads % plan.tp:
        raise UserError(f"bad plan: tp={plan.tp} does not divide the model's {shape.heads} attention heads",
                        "pick tp dividing the head count")
    kv = shape.kv_heads
    if kv and (plan.tp % kv if plan.tp > kv else kv % plan.tp):
        raise UserError(f"bad plan: tp={plan.tp} neither divides nor is a multiple of the model's {kv} KV heads",
                        "pick tp dividing the KV-head count (or a multiple of it)")
    if plan.ep > 1 and shape.experts == 0 and shape.heads:
        raise UserError(f"bad plan: ep={plan.ep} but the model has no experts", "set ep=1")
    if shape.experts and shape.experts % plan.ep:
        raise UserError(f"bad plan: ep={plan.ep} does not divide the model's {shape.experts} experts",
                        "pick ep dividing the expert count")
