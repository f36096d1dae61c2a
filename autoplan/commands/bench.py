"""``autoplan bench``: auto plan vs hand-written 4D recipes vs a Megatron grid, case by case.

    autoplan bench                                   the default suite (12 cases, 256–16,384 GPUs)
    autoplan bench --suite quick --out /tmp/bench    four small cases, under a minute on 2 cores
    autoplan bench --cases gpt3-175b-h100x1024 --force
    autoplan bench --out experiments/bench --results-md experiments/RESULTS.md

Writes ``OUT/results.json``, ``OUT/results.csv``, ``OUT/table.md``, three PNG plots and one
cached record per case under ``OUT/cases/`` (a re-run skips cached cases unless ``--force``).
A case that fails is logged with its error and the suite goes on.  The harness itself is
``autoplan.bench``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from autoplan.errors import UserError

DEFAULT_OUT = "autoplan-bench"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark the automatic plan against hand-written 4D recipes and a Megatron grid",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] + "\n\n" + __doc__.split("\n\n")[1] + "\n\n"
        + __doc__.split("\n\n")[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("default", "quick"), default="default", help="which cases (default: default)")
    p.add_argument("--out", metavar="DIR", help=f"output folder (default: ./{DEFAULT_OUT}/SUITE)")
    p.add_argument("--force", action="store_true", help="re-run cases that are already cached in DIR")
    p.add_argument("--cases", metavar="NAME,...", help="run only these cases of the suite (comma-separated)")
    p.add_argument("--workers", type=int, default=0, help="search worker processes (default: one per CPU core)")
    p.add_argument("--search-timeout", type=float, default=900.0, metavar="S",
                   help="seconds a case's search may take before the case is marked failed (default 900; 0: none)")
    p.add_argument("--results-md", metavar="PATH",
                   help="also write the tables, the answer and the plot links into PATH between "
                        "<!-- bench:start --> and <!-- bench:end --> (other sections untouched)")
    p.add_argument("--json", action="store_true", help="print results.json to stdout instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.bench import SUITES, run_suite, select

    if args.workers < 0:
        raise UserError(f"--workers must be ≥ 0, got {args.workers}", "pass --workers N, or 0 for one per core")
    if args.search_timeout < 0:
        raise UserError(f"--search-timeout must be ≥ 0, got {args.search_timeout}", "pass seconds, or 0 for no limit")
    names = [n.strip() for n in args.cases.split(",") if n.strip()] if args.cases else None
    if args.cases is not None and not names:
        raise UserError("--cases names no case", "pass --cases NAME[,NAME...]")
    cases = select(args.suite, names)
    out = args.out or os.path.join(DEFAULT_OUT, args.suite)
    command = _command(args, out)
    log = (lambda line: None) if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    records = run_suite(cases, out, suite=args.suite, all_cases=SUITES[args.suite], command=command,
                        force=args.force, workers=args.workers, search_timeout_s=args.search_timeout,
                        results_md=args.results_md, log=log)
    if args.json:
        with open(os.path.join(out, "results.json")) as f:
            print(f.read(), end="")
        return 0
    _print(records, out)
    return 0


def _command(args: argparse.Namespace, out: str) -> str:
    """The command line that reproduces this run's outputs (what RESULTS.md quotes)."""
    parts = ["autoplan", "bench", "--suite", args.suite, "--out", out]
    if args.cases:
        parts += ["--cases", args.cases]
    if args.search_timeout != 900.0:
        parts += ["--search-timeout", f"{args.search_timeout:g}"]
    if args.results_md:
        parts += ["--results-md", args.results_md]
    return " ".join(shlex.quote(p) for p in parts)


def _print(records: list[dict], out: str) -> None:
    from rich import box
    from rich.table import Table

    from autoplan.bench.report import compact_plan
    from autoplan.commands.common import wide_console

    table = Table(box=box.SIMPLE_HEAD, title="auto vs hand-written 4D (same cost model)")
    for col in ("case", "GPUs", "auto plan", "auto MFU", "best recipe", "recipe MFU", "grid MFU", "auto/hand",
                "auto/hand p10–p90", "P(auto wins)", "auto/grid", "search s"):
        table.add_column(col, justify="left" if col in ("case", "auto plan", "best recipe") else "right")
    for r in records:
        rows = {c["contender"]: c for c in r.get("contenders") or []}
        auto = rows.get("auto", {})
        if auto.get("status") != "ok":
            table.add_row(r["case"]["name"], str(r.get("gpus", "")), f"[red]failed: {r['error']}[/red]",
                          *[""] * 9)
            continue
        hand = r.get("best_hand")
        grid = rows["grid"]
        table.add_row(r["case"]["name"], f"{r['gpus']:,}", compact_plan(auto["plan"]), f"{auto['mfu']:.1%}",
                      hand or "—", f"{rows[hand]['mfu']:.1%}" if hand else "—",
                      f"{grid['mfu']:.1%}" if grid["status"] == "ok" else "—",
                      _num(r.get("auto_vs_hand")), _band(r), _share(r.get("p_auto_beats_hand")),
                      _num(r.get("auto_vs_grid")), f"{r['search_s']:.1f}")
    console = wide_console()
    console.print(table)
    console.print(f"[dim]results: {os.path.join(out, 'results.json')}, results.csv, table.md, "
                  f"mfu.png, ratio.png, search_time.png[/dim]")


def _num(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def _band(r: dict) -> str:
    lo, hi = r.get("auto_vs_hand_p10"), r.get("auto_vs_hand_p90")
    breaks = r.get("band_hand", r.get("best_hand")) != r.get("best_hand")      # against a rule-breaking recipe
    return "—" if lo is None else f"{lo:.2f}–{hi:.2f}" + ("†" if breaks else "")


def _share(x) -> str:
    return "—" if x is None else f"{x:.0%}"
