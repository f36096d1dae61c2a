"""``autoplan estimate``: price a hand-written plan with the cost model.

    autoplan estimate gpt3-175b --cluster h100x1024 \\
        --plan tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective --seq 2048 --global-batch 1536

The plan runs Megatron's operator sharding for tp/sp (column- then row-parallel, which the
block ILP recovers on its own).  ``--json`` prints the Estimate: step_time_s, tokens_per_s,
tokens_per_s_per_gpu, samples_per_s, throughput_unit (tokens, or samples for inputs that are not
token ids; tokens_per_s then counts the positions per sample the blocks see), mfu, hfu,
model_flops_per_step, memory_gib (max over GPUs),
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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.commands.common import add_band_args, add_estimate_args, add_workload_args
from autoplan.errors import UserError

if TYPE_CHECKING:
    from autoplan.cost import Estimate, EstimateOptions, Estimator
    from autoplan.cost.evidence import Flag
    from autoplan.cost.uncertainty import Sampler
    from autoplan.ir import BlockGraph
    from autoplan.plan import Plan
    from autoplan.workload import Workload
    from topologies.cluster import Cluster


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
    add_estimate_args(p)
    add_band_args(p)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.commands.common import estimate_options_from
    from autoplan.export.load import load_plan, load_plans
    from autoplan.workload import Workload, load_cluster

    cluster = load_cluster(args.cluster)                      # bad input fails before the trace
    options = estimate_options_from(args, cluster.gpu.hbm_bytes)
    if args.plans:
        plans = load_plans(args.plans, num_gpus=cluster.num_gpus)
    else:
        plans = [load_plan(args.plan, num_gpus=cluster.num_gpus)]
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch,
                      trace_timeout_s=args.trace_timeout)
    pricer = _pricer(args, w, options)
    if args.plans:
        print(json.dumps(_priced_file(args.plans, plans, pricer), sort_keys=True))
        return 0
    priced = pricer.price(plans[0])
    if args.json:
        print(json.dumps(priced.to_json(), sort_keys=True))
    else:
        _print_table(priced, w.model, cluster, args.global_batch)
    return 0


@dataclass(frozen=True)
class _Priced:
    """One plan's estimate, its band (None without samples) and its evidence flags."""

    plan: Plan
    estimate: Estimate
    band: dict | None
    evidence: tuple[Flag, ...]

    def to_json(self) -> dict:
        from autoplan.cost import rounded

        return rounded({**self.estimate.to_dict(), **(self.band or {}),
                        "evidence": [f.to_dict() for f in self.evidence]})


@dataclass(frozen=True)
class _Pricer:
    """Prices plans of one workload: one estimator, one sampler (None without ``--samples``)."""

    estimator: Estimator
    sampler: Sampler | None
    global_batch: int
    moe: bool

    def price(self, plan: Plan) -> _Priced:
        from autoplan.cost.evidence import flags

        est = self.estimator.estimate(plan, self.global_batch)
        band = self.sampler.band(plan, self.global_batch, est).fields() if self.sampler else None
        return _Priced(plan=plan, estimate=est, band=band, evidence=flags(plan, est, moe=self.moe))


def _pricer(args: argparse.Namespace, workload: Workload, options: EstimateOptions) -> _Pricer:
    """The estimator of the command line's options, and the sampler of its band options."""
    from autoplan.cost.uncertainty import Sampler

    estimator = workload.estimator(options)
    sampler = Sampler(estimator, args.samples, args.seed) if args.samples else None
    return _Pricer(estimator=estimator, sampler=sampler, global_batch=args.global_batch,
                   moe=bool(workload.model.model.experts))


def _priced_file(path: str, plans: list[Plan], pricer: _Pricer) -> list[dict]:
    """The JSON estimate of every plan of a ``--plans`` file; an error names the plan's line."""
    out = []
    for i, plan in enumerate(plans):
        try:
            out.append(pricer.price(plan).to_json())
        except UserError as e:
            raise UserError(f"plans file {path}, plan {i + 1} ({plan.to_string()}): {e.problem}", e.fix) from None
    return out


def _print_table(priced: _Priced, graph: BlockGraph, cluster: Cluster, global_batch: int) -> None:
    from autoplan.commands.common import print_estimate, run_header, wide_console

    console = wide_console()
    console.print(run_header(graph, cluster, global_batch))
    print_estimate(console, priced.plan, priced.estimate, band=priced.band)
    for f in priced.evidence:
        console.print(f"[yellow]evidence[/yellow] {f.regime}: {f.text}")
