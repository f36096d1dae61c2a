"""``autoplan search``: the K best distinct parallel plans for a model on a cluster.

    autoplan search gpt3-175b --cluster h100x1024
    autoplan search llama3-8b --cluster h100x256 --seq 131072 --global-batch 64 --top 3 --json
    autoplan search model.py --cluster my_cluster.yaml --report plans.html
    autoplan search llama3-70b --cluster h100x1024 --seq 8192 --precision auto

Prints a ranked table of plans in the compact notation (``tp2·cp2·pp8·dp32 zero2 mbs2 zbv``;
``--wide``: the full string), bold where the plans differ, ``1=`` for plans that tie within
0.5 %; or ``--json``: a list of {plan, estimate}, byte-identical for the same inputs.  Plans
respect the hard rule that per-layer collectives (TP/SP, EP all-to-all, Ulysses all-to-all) stay
inside one NVLink domain unless ``--allow-cross-domain``.  A search longer than a second shows a
progress bar on stderr when stderr is a terminal; ``--report`` says on stderr where it wrote.
"""
from __future__ import annotations

import argparse
import json
import sys

from autoplan.commands.choices import DEFAULT_OBJECTIVE, OBJECTIVES
from autoplan.commands.common import add_band_args, add_estimate_args, add_workload_args
from autoplan.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("search", help="search the K best distinct parallel plans",
                              description=__doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--top", type=int, default=5, metavar="K", help="how many distinct meshes to return (default 5)")
    p.add_argument("--workers", type=int, default=0, help="worker processes (default: one per CPU core)")
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE,
                   help="rank by the point step time, its p50 / p90 over the samples, or the p90 regret "
                        f"against the best plan of each sample (default {DEFAULT_OBJECTIVE}; README 'Bands')")
    add_band_args(p)
    p.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report")
    p.add_argument("--precision", default="bf16", metavar="P",
                   help="the linear GEMMs' precision, a plan dimension: auto (the GPU's FP8 recipe and bf16: "
                        "fp8 on Hopper, mxfp8 on Blackwell), or a comma-separated list of bf16, fp8, "
                        "fp8-rowwise, fp8-delayed, mxfp8 (default bf16)")
    add_estimate_args(p, rules=True)
    p.add_argument("--json", action="store_true", help="print a JSON list of {plan, estimate}")
    p.add_argument("--wide", action="store_true",
                   help="print every plan as its full key=value string (default: the compact notation)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="with --json: write the list to PATH (whole, or not at all) instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.atomic import write_text
    from autoplan.commands.common import estimate_options_from, wide_console
    from autoplan.cost import rounded
    from autoplan.plan import search_precisions
    from autoplan.search import SearchOptions, search
    from autoplan.workload import Workload, load_cluster

    if args.top < 1:
        raise UserError(f"--top must be ≥ 1, got {args.top}", "pass --top K with K ≥ 1")
    if args.output and not args.json:
        raise UserError("-o/--output writes the --json list", "add --json, or drop -o")
    cluster = load_cluster(args.cluster)                      # bad input fails before the trace
    estimate = estimate_options_from(args, cluster.gpu.hbm_bytes)
    precisions = search_precisions(args.precision, cluster.gpu.name, cluster.gpu.precisions)
    w = Workload.load(args.model, cluster, seq=args.seq, global_batch=args.global_batch,
                      trace_timeout_s=args.trace_timeout)
    graph = w.model
    options = SearchOptions(estimate=estimate, top_k=args.top, workers=args.workers,
                            progress=sys.stderr.isatty(),   # stderr: stdout stays the same bytes
                            objective=args.objective, samples=args.samples, seed=args.seed, precisions=precisions)
    result = search(graph, cluster, global_batch=args.global_batch, options=options)
    if args.report:
        _write_report(args, graph, cluster, result, options)
    if args.json:
        text = json.dumps([rounded(c.to_dict()) for c in result.candidates], indent=2, sort_keys=True,
                          ensure_ascii=False) + "\n"
        line = rule_breaking_line(graph, result, estimate.allow_cross_domain)
        if line:
            print(line, file=sys.stderr)                     # stdout stays the JSON list
        if args.output:
            write_text(args.output, text)
        if args.report:
            print(f"wrote the HTML report to {args.report}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    _print(wide_console(min_width=200 if args.wide else 0), graph, cluster, args, result)
    if args.report:
        sys.stdout.flush()
        print(f"wrote the HTML report to {args.report}", file=sys.stderr)
    return 0


def _print(console, graph, cluster, args, result) -> None:
    from autoplan.commands.common import run_header
    from autoplan.commands.plans_table import plans_table, tie_note
    from autoplan.search.robust import FOLD_TOLERANCE

    console.print(run_header(graph, cluster, args.global_batch))
    console.print(plans_table(result.candidates, graph.throughput_unit, wide=args.wide, width=console.width,
                              objective=args.objective))
    note = tie_note(result.candidates)
    if note:
        console.print(note)
    _precision_notes(console, graph, cluster, args, result)
    for i, c in enumerate(result.candidates, 1):
        if c.robust is not None and c.robust.folded:
            console.print(f"[dim]#{i} alike (within {FOLD_TOLERANCE:.1%} on every sample): "
                          f"{', '.join(c.robust.folded)}[/dim]")
    if any(c.evidence for c in result.candidates):
        console.print("[dim]unvalidated: regimes no timed published run covers (costmodels/evidence.yaml); "
                      "`explain` says which and why[/dim]")
    if result.candidates:
        e = result.candidates[0].estimate
        console.print(f"[dim]memory limit {e.memory_limit_gib:.1f} GiB per GPU = {e.hbm_gib:.1f} GiB HBM − "
                      f"{e.memory_margin_gib:g} GiB margin (--memory-margin)[/dim]")
    st = result.stats
    console.print(f"[dim]{st.space.generated} meshes after the NVLink rules ({st.space.broke_rules} degree choices "
                  f"broke them), {st.pruned_memory} cannot hold their model states, {st.pruned_bound} bounded out, "
                  f"{st.meshes_evaluated} searched, {st.plans_priced} plans priced, "
                  f"{len(st.ilps)} block ILPs; {st.seconds:.1f} s[/dim]")
    for line in (point_optimum_line(result), rule_breaking_line(graph, result, getattr(args, "allow_cross_domain",
                                                                                       False))):
        if line:
            console.print(f"[dim]{line}[/dim]")
    if result.max_ilp_gap > 0:
        console.print(f"[yellow]a block ILP hit its time limit: the plans use its best solution, "
                      f"optimality gap {result.max_ilp_gap:.2%}[/yellow] (raise --time-limit)")


def _precision_notes(console, graph, cluster, args, result) -> None:
    """Under the table, per listed plan in a low precision: its step against itself in bf16."""
    from autoplan.commands.common import estimate_options_from
    from autoplan.cost import Estimator
    from autoplan.explain.precision import precision_saving

    low = [(i, c) for i, c in enumerate(result.candidates, 1) if c.plan.precision != "bf16"]
    if not low:
        return
    est = Estimator(graph, cluster, estimate_options_from(args, cluster.gpu.hbm_bytes))
    for i, c in low:
        saving = precision_saving(est, c.plan, c.estimate, args.global_batch)
        if saving is not None:
            console.print(f"[dim]#{i} {saving.text()}[/dim]")


def point_optimum_line(result) -> str:
    """Under a robust objective, the plan fastest at the point estimate when the ranking left it out
    of the listed plans (a plan that wins at the nominal model and loses under some plausible one):
    its step against #1 and its p10–p90, so that the trade the ranking made is visible; '' otherwise."""
    fitting = [c for c in result.pool if c.estimate.fits]
    if not fitting or not result.candidates:
        return ""
    fastest = min(fitting, key=lambda c: (c.estimate.step_time_s, c.plan.to_string()))
    shown = {c.plan.to_string() for c in result.candidates}
    shown |= {key for c in result.candidates if c.robust is not None for key in c.robust.folded}
    if fastest.plan.to_string() in shown:
        return ""
    step, first = fastest.estimate.step_time_s, result.candidates[0].estimate.step_time_s
    band = "" if fastest.band is None else f", p10–p90 {fastest.band.step(0.1):.3f}–{fastest.band.step(0.9):.3f} s"
    return (f"fastest at the point estimate, ranked below the listed plans: {fastest.plan.to_compact()} "
            f"{step:.3f} s ({step / first - 1:+.1%} vs #1{band})")


def rule_breaking_line(graph, result, lifted: bool) -> str:
    """The one line an MoE search under the NVLink rule prints on what the rule costs: the best
    plan whose expert groups cross NVLink domains (cross-node EP) and its step against #1; '' for
    a dense model or with ``--allow-cross-domain`` (``lifted``)."""
    if not graph.model.experts or lifted or not result.candidates:
        return ""
    rb = result.rule_breaking
    if rb is None:
        return "rule-breaking (cross-node EP): no plan with expert groups across NVLink domains fits"
    best = result.candidates[0].estimate.step_time_s
    step = rb.estimate.step_time_s
    return (f"rule-breaking (cross-node EP, --allow-cross-domain): best {rb.plan.to_compact()} {step:.3f} s, "
            f"{step / best - 1:+.1%} vs #1")


def _write_report(args, graph, cluster, result, options) -> None:
    from autoplan.cost import Estimator
    from autoplan.explain.report import render_report

    estimator = Estimator(graph, cluster, options.estimate)   # priced as the search priced
    cs = result.candidates
    html = render_report(graph.model.name, cluster, [(c.plan, c.estimate) for c in cs], estimator,
                         bands=[c.band for c in cs], robust=[c.robust for c in cs])
    from autoplan.atomic import write_text

    write_text(args.report, html, flag="--report")
