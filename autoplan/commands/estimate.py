"""``autoplan estimate``: price a hand-written plan with the cost model.

    autoplan estimate gpt3-175b --cluster h100x1024 \\
        --plan tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective --seq 2048 --global-batch 1536

The plan runs Megatron's operator sharding for tp/sp (column- then row-parallel, which the
block ILP recovers on its own).  ``--json`` prints the Estimate: step_time_s, tokens_per_s,
tokens_per_s_per_gpu, mfu, hfu, model_flops_per_step, memory_gib (max over GPUs),
memory_breakdown_gib {params, grads, optimizer, activations, other}, fits,
bubble_fraction, comm_exposed_s, violations [{rule, text}], primitives [{kind, dim,
group_size, span, level, calls_per_step, bytes_per_call, time_s, exposed_s}] and more.
"""
from __future__ import annotations

import argparse
import json

from autoplan.commands.common import add_band_args, add_workload_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("estimate", help="price a hand-written plan (step time, MFU, memory, collectives)",
                              description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--plan", required=True, metavar="PLAN",
                   help="plan string (e.g. tp=8,pp=8,vpp=3,recompute=selective) or a plan JSON file")
    p.add_argument("--profile", metavar="PATH", help="compute profile YAML (default: the GPU's, costmodels/profiles)")
    p.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="do not overlap the data-parallel gradient reduction with backward (2021-era Megatron)")
    add_band_args(p)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.baselines.common import price
    from autoplan.commands.common import print_estimate, wide_console
    from autoplan.cost import EstimateOptions, rounded
    from autoplan.cost.params import NOMINAL, load_override
    from autoplan.cost.evidence import flags
    from autoplan.cost.uncertainty import Sampler
    from autoplan.export.load import load_plan
    from autoplan.workload import Workload, load_cluster

    cluster = load_cluster(args.cluster)                      # bad input fails before the trace
    plan = load_plan(args.plan, num_gpus=cluster.num_gpus)
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch)
    graph = w.model
    params = load_override(args.params) if args.params else NOMINAL
    estimator = w.estimator(EstimateOptions(overlap_grad_reduce=not args.no_overlap_grad_reduce, profile=args.profile,
                                            params=params))
    est = price(estimator, plan, args.global_batch)
    band = Sampler(estimator, args.samples, args.seed).band(plan, args.global_batch, est).fields() \
        if args.samples else None
    evidence = flags(plan, est, moe=bool(graph.model.experts))
    if args.json:
        print(json.dumps(rounded({**est.to_dict(), **(band or {}), "evidence": [f.to_dict() for f in evidence]}),
                         sort_keys=True))
        return 0
    console = wide_console()
    console.print(f"{graph.model.name} on {cluster.name} ({cluster.describe()}), seq {args.seq:,}, "
                  f"global batch {args.global_batch:,}")
    print_estimate(console, plan, est, band=band)
    for f in evidence:
        console.print(f"[yellow]evidence[/yellow] {f.regime}: {f.text}")
    return 0
