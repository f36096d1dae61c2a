"""``autoplan study``: answer one open question of 4D-parallel practice by sweeping the search.

    autoplan study q4 --quick                       ring vs Ulysses vs USP, a small grid (minutes)
    autoplan study q5 --tiny --out /tmp/q5          a smoke grid on a 4-layer model (seconds)
    autoplan study q3 --out experiments/study/q3    SP: the full grid, its files in that folder
    autoplan study q2 --json                        FSDP alone: results.json on stdout
    autoplan study all --quick --out DIR            all five under DIR/q1 … DIR/q5, and DIR/report.html
    autoplan study report --out DIR                 DIR/report.html from the studies already under DIR

Each point of a study's grid is the search's best plan under that point's constraint (never a
fixed recipe).  Writes ``results.json`` (answer, grid, points, leans_on, rules), ``table.md``,
``QN.png``, ``answer.md`` and ``report.html`` under ``--out`` (default ./autoplan-study/QN);
the answer states the regimes it leans on with their out-of-sample error
(``costmodels/cross_validation.json``) and where a margin is inside that error.  ``all`` runs the
five one after another into ``--out``'s q1 … q5 (default ./autoplan-study) and writes
``report.html`` there: one page, a section per study (figure, answer with its error band, rules,
table); ``report`` writes that page from the studies already there, searching nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from autoplan.commands.choices import STUDY_QUESTIONS
from autoplan.errors import UserError

DEFAULT_OUT = "autoplan-study"
GROUPS = ("all", "report")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "study", help="answer an open question of 4D-parallel practice by sweeping the search (q1 … q5)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] + "\n\n" + __doc__.split("\n\n")[1] + "\n\n"
        + __doc__.split("\n\n")[2] + "\n\nquestions:\n" + "\n".join(f"  {k}  {v}" for k, v in STUDY_QUESTIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question", choices=(*STUDY_QUESTIONS, *GROUPS), metavar="QUESTION",
                   help=f"which question: {', '.join(STUDY_QUESTIONS)}; or {GROUPS[0]} (the five and one HTML report), "
                        f"or {GROUPS[1]} (the HTML report of the studies under --out, searching nothing)")
    p.add_argument("--out", metavar="DIR",
                   help=f"output folder (default: ./{DEFAULT_OUT}/QUESTION; ./{DEFAULT_OUT} for all and report)")
    p.add_argument("--json", action="store_true",
                   help="print results.json to stdout instead of the answer (all, report: the report's path and "
                        "each study's question, title, headline, error band and command)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="size", default="full",
                      help="the small grid (a few minutes on 2 cores) instead of the full one")
    size.add_argument("--tiny", action="store_const", const="tiny", dest="size",
                      help="a smoke grid on a 4-layer model (seconds): checks the study runs, answers nothing")
    p.add_argument("--workers", type=int, default=0, help="search worker processes (default: one per CPU core)")
    p.add_argument("--results-md", metavar="PATH",
                   help="also write the study's section into PATH between <!-- study-QUESTION:start --> and "
                        "<!-- study-QUESTION:end --> (other sections untouched)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.study import run_study

    if args.workers < 0:
        raise UserError(f"--workers must be ≥ 0, got {args.workers}", "pass --workers N, or 0 for one per core")
    out = args.out or (DEFAULT_OUT if args.question in GROUPS else os.path.join(DEFAULT_OUT, args.question))
    if not out.strip():
        raise UserError("--out is empty", "give --out a folder path (it is created if missing)")
    if args.question in GROUPS:
        return _run_group(args, out)
    parts = ["autoplan", "study", args.question] + ([] if args.size == "full" else [f"--{args.size}"])
    parts += (["--out", args.out] if args.out else []) + (["--results-md", args.results_md] if args.results_md else [])
    quiet = args.json
    say = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    results = run_study(args.question, out, size=args.size, workers=args.workers, results_md=args.results_md,
                        command=" ".join(shlex.quote(x) for x in parts), say=say)
    if args.json:
        with open(os.path.join(out, "results.json")) as f:
            sys.stdout.write(f.read())
        return 0
    print(f"{results['title']}\n\n{results['answer']}\n")
    print("leans on: " + "; ".join(f"{x['regime']} ({x['points']} points): {x['out_of_sample_mean']:.1%} "
                                   f"out-of-sample mean error" for x in results["leans_on"]))
    print(f"files: {out}/results.json, table.md, {args.question}.png, answer.md, report.html")
    return 0


def _command(question: str, size: str, out: str, results_md: str | None) -> str:
    """The command that makes study ``question`` alone, as it is recorded in its results."""
    parts = ["autoplan", "study", question] + ([] if size == "full" else [f"--{size}"]) + ["--out", out]
    return " ".join(shlex.quote(x) for x in parts + (["--results-md", results_md] if results_md else []))


def _run_group(args: argparse.Namespace, out: str) -> int:
    """``study all`` (the five, then the report) or ``study report`` (the report alone)."""
    from autoplan.study import run_all, write_report

    say = (lambda line: None) if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    if args.question == "report":
        if args.size != "full" or args.results_md:
            raise UserError("study report searches nothing: --quick, --tiny and --results-md do not apply",
                            "run `autoplan study all --quick --out DIR` to make the studies, then "
                            "`autoplan study report --out DIR`")
        path = write_report(out, say=say)
    else:
        run_all(out, size=args.size, workers=args.workers, results_md=args.results_md, say=say,
                command=lambda q: _command(q, args.size, os.path.join(out, q), args.results_md))
        path = os.path.join(out, "report.html")
    if args.json:
        print(json.dumps({"report": path, "studies": _summaries(out)}, indent=1, ensure_ascii=False))
        return 0
    print(f"report: {path}")
    return 0


def _summaries(out: str) -> list[dict]:
    """Per study on the report: question, title, headline, error band, command."""
    from autoplan.study.output import error_band_text, read_study

    found = (read_study(os.path.join(out, q), q) for q in STUDY_QUESTIONS)
    return [{"question": r["question"], "title": r["title"], "headline": r.get("headline", ""),
             "error_band": error_band_text(r), "command": r["command"]} for r, _, _ in filter(None, found)]
