"""``autoplan estimate``: price a hand-written plan with the cost model.

    autoplan estimate gpt3-175b --cluster h100x1024 \\
        --plan tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective --seq 2048 --global-batch 1536

The plan runs Megatron's operator sharding for tp/sp (column- then row-parallel, which the
block ILP recovers on its own).  ``--json`` prints the Estimate: step_time_s, tokens_per_s,
tokens_per_s_per_gpu, samples_per_s, throughput_unit (tokens, or samples for inputs that are not
token ids; tokens_per_s then counts the positions per sample the blocks see), mfu, hfu, model_flops_per_step, memory_gib (max over GPUs),
memory_breakdown_gib {params, grads, optimizer, activations, other}, memory_margin_gib,
memory_limit_gib (HBM − margin), fits (peak ≤ HBM − margin), activations_alive,
bubble_fraction, comm_exposed_s, violations [{rule, text}], primitives [{kind, dim,
group_size, span, level, calls_per_step, bytes_per_call, time_s, exposed_s}] and more.
``--plans FILE`` prices many plans with one trace and one estimator (one plan string per line,
or a JSON list) and prints a JSON list of those estimates, in the file's order.
"""
from __future__ import annotations

import argparse
import json

from autoplan.commands.common import add_band_args, add_engine_args, add_margin_arg, add_workload_args

MAX_FSDP_PREFETCH = 64


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("estimate", help="price a hand-written plan (step time, MFU, memory, collectives)",
                              description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--plan", metavar="PLAN",
                       help="plan string (e.g. tp=8,pp=8,vpp=3,recompute=selective) or a plan JSON file")
    which.add_argument("--plans", metavar="FILE",
                       help="many plans: one plan string per line, or a JSON list; prints a JSON list of "
                            "estimates in the same order (one trace, one estimator for all)")
    p.add_argument("--profile", metavar="PATH", help="compute profile YAML (default: the GPU's, costmodels/profiles)")
    p.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="do not overlap the data-parallel gradient reduction with backward (2021-era Megatron)")
    p.add_argument("--fsdp-prefetch", type=int, default=1, metavar="N",
                   help="ZeRO-3: FSDP units gathered ahead of the one computing (default 1, FSDP2's implicit prefetch)")
    p.add_argument("--fsdp-reshard", choices=("on", "off"), default=None,
                   help="ZeRO-3: reshard parameters after forward (default: on at pp=1, off under PP, as torchtitan)")
    add_engine_args(p)
    add_margin_arg(p)
    add_band_args(p)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.baselines.common import price
    from autoplan.commands.common import memory_margin, print_estimate, run_header, wide_console
    from autoplan.cost import EstimateOptions, rounded
    from autoplan.cost.evidence import flags
    from autoplan.cost.params import NOMINAL, load_override
    from autoplan.cost.uncertainty import Sampler
    from autoplan.errors import UserError
    from autoplan.export.load import load_plan, load_plans
    from autoplan.workload import Workload, load_cluster

    if not 1 <= args.fsdp_prefetch <= MAX_FSDP_PREFETCH:
        raise UserError(f"--fsdp-prefetch {args.fsdp_prefetch} is out of range",
                        f"give 1 to {MAX_FSDP_PREFETCH} units")
    cluster = load_cluster(args.cluster)                      # bad input fails before the trace
    margin = memory_margin(args, cluster.gpu.hbm_bytes)
    if args.plans:
        plans = load_plans(args.plans, num_gpus=cluster.num_gpus)
    else:
        plans = [load_plan(args.plan, num_gpus=cluster.num_gpus)]
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch)
    graph = w.model
    params = load_override(args.params) if args.params else NOMINAL
    estimator = w.estimator(EstimateOptions(
        overlap_grad_reduce=not args.no_overlap_grad_reduce, profile=args.profile, fsdp_prefetch=args.fsdp_prefetch,
        fsdp_reshard_after_forward=None if args.fsdp_reshard is None else args.fsdp_reshard == "on",
        fsdp_grad_sync=args.fsdp_grad_sync,
        kernels=args.kernels,
        memory_margin_gib=margin, params=params))
    sampler = Sampler(estimator, args.samples, args.seed) if args.samples else None

    def priced(plan):
        """The plan's estimate, its band (None without samples) and its evidence flags."""
        est = price(estimator, plan, args.global_batch)
        band = sampler.band(plan, args.global_batch, est).fields() if sampler else None
        return est, band, flags(plan, est, moe=bool(graph.model.experts))

    def as_json(est, band, evidence) -> dict:
        return rounded({**est.to_dict(), **(band or {}), "evidence": [f.to_dict() for f in evidence]})

    if args.plans:
        ests = []
        for i, plan in enumerate(plans):
            try:
                ests.append(as_json(*priced(plan)))
            except UserError as e:
                raise UserError(f"plans file {args.plans}, plan {i + 1} ({plan.to_string()}): {e.problem}",
                                e.fix) from None
        print(json.dumps(ests, sort_keys=True))
        return 0
    plan = plans[0]
    est, band, evidence = priced(plan)
    if args.json:
        print(json.dumps(as_json(est, band, evidence), sort_keys=True))
        return 0
    console = wide_console()
    console.print(run_header(graph, cluster, args.global_batch))
    print_estimate(console, plan, est, band=band)
    for f in evidence:
        console.print(f"[yellow]evidence[/yellow] {f.regime}: {f.text}")
    return 0
