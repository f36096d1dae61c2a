"""The open questions of 4D-parallel practice, answered by sweeping the search (``autoplan study``).

    from autoplan.study import run_all, run_study, write_report
    results = run_study("q4", "out/q4", size="quick")
    run_all("out", size="quick")          # out/q1 … out/q5, and out/report.html with all five
    write_report("out")                   # out/report.html from the studies already under out/

One module per question, each a grid of settings searched with ``autoplan.search`` under the
constraints that question varies (``common.Setting``) and an analysis of the plans found:

* ``q1``: does an automatic plan reach 90–95 % of a hand-written 4D plan at 100B+ and > 1K GPUs?
  (the benchmark's cases, the published layouts as hand baselines);
* ``q2``: where does FSDP/ZeRO-3 alone stop being enough (MFU ceiling, break-point by model
  size, sequence, GPU count, network)?
* ``q3``: when does sequence parallelism stop being optional (sequence length, attention's
  share, the micro-batch floor)?  Is "attention > 30 % → SP" right?
* ``q4``: ring vs Ulysses vs USP — break-points by sequence length, heads and KV heads, and the
  NVLink/IB bandwidth ratio;
* ``q5``: can recomputation replace SP/CP at long context; from which length does CP become
  necessary (memory wall) or faster?

Each writes ``results.json`` (``answer``, ``grid``, ``points``, ``leans_on``, ``rules``), a
Markdown table, a figure and an HTML report (``output``); ``write_report`` puts every study
under one folder on one HTML page (figure, table, answer with its error band).  Each answer
quotes the out-of-sample error of every regime its plans lean on (``common``).  The cost model
and the search never import this package.
"""
from __future__ import annotations

import importlib
import os
import resource
import time
from collections.abc import Callable

from autoplan.atomic import write_section, write_text
from autoplan.errors import UserError
from autoplan.study.common import SAMPLES, Sweep, load_errors
from autoplan.study.output import check_out, read_study, report_html, results_section, write_study

QUESTIONS = {
    "q1": "auto vs hand-written 4D at 100B+ and > 1K GPUs, published layouts as hand baselines",
    "q2": "where FSDP/ZeRO-3 alone stops being enough: MFU ceiling and break-point",
    "q3": "when sequence parallelism (with selective recompute) stops being optional",
    "q4": "ring vs Ulysses vs USP: break-points by sequence, heads and NVLink/IB ratio",
    "q5": "can recomputation replace SP/CP at long context; when CP becomes necessary or faster",
}


SIZES = ("full", "quick", "tiny")
"""Grid sizes: the full grid (documented run times in RESULTS.md), ``quick`` (minutes on 2 cores,
the slow tests) and ``tiny`` (a smoke grid on a 4-layer model, seconds: the fast tests)."""


def run_study(question: str, out: str, *, size: str = "full", workers: int = 0, command: str = "",
              results_md: str | None = None, say: Callable[[str], None] = print) -> dict:
    """Run study ``question`` (a key of ``QUESTIONS``) on its ``size`` grid, write its files under
    ``out`` (and its section of ``results_md``) and return its ``results.json`` content."""
    check_out(out)
    module = importlib.import_module(f"autoplan.study.{question}")
    errors = load_errors()
    sweep = Sweep(workers=workers, samples=SAMPLES[size], log_line=say)
    start, cpu = time.perf_counter(), _cpu_s()
    say(f"{question}: {QUESTIONS[question]} ({size} grid)")
    study = module.study(sweep, errors, size=size)
    results = study.to_dict(command=command or f"autoplan study {question}" + ("" if size == "full" else f" --{size}"),
                            size=size, seconds=time.perf_counter() - start, searches=sweep.searches)
    results.update(cpu_s=round(_cpu_s() - cpu, 1), cores=os.cpu_count())
    paths = write_study(out, question, results, study.table, module.figure(results), say=say)
    if results_md:
        write_section(results_md, f"study-{question}", results_section(results, study.table, paths, results_md))
        say(f"wrote the study-{question} section of {results_md}")
    return results


def run_all(out: str, *, size: str = "full", workers: int = 0, results_md: str | None = None,
            command: Callable[[str], str] | None = None, say: Callable[[str], None] = print) -> list[dict]:
    """Every study, one after another, each under ``out/QN`` (``command(QN)``: the command each
    records, the one that reruns it alone), then ``out/report.html`` with all five
    (``write_report``).  Returns the five ``results.json`` contents."""
    check_out(out)
    results = [run_study(q, os.path.join(out, q), size=size, workers=workers, results_md=results_md,
                         command=command(q) if command else "", say=say) for q in QUESTIONS]
    write_report(out, say=say)
    return results


def write_report(out: str, *, say: Callable[[str], None] = print) -> str:
    """``out/report.html``: one self-contained page with every study found under ``out/q1`` …
    ``out/q5`` (each written by ``run_study``; runs no search), the missing ones named with the
    command that makes them.  A UserError (exit 2) where ``out`` holds none.  Returns its path."""
    found, missing = [], []
    for q in QUESTIONS:
        study = read_study(os.path.join(out, q), q)
        if study is None:
            missing.append(f"autoplan study {q} --out {os.path.join(out, q)}")
        else:
            found.append(study)
    if not found:
        raise UserError(f"no study under {out}: none of {', '.join(os.path.join(out, q) for q in QUESTIONS)} holds "
                        "results.json, table.md and its figure",
                        f"run `autoplan study all --out {out}` (or one question: `autoplan study q4 --out "
                        f"{os.path.join(out, 'q4')}`) first")
    path = os.path.join(check_out(out), "report.html")
    write_text(path, report_html(found, missing), flag="--out")
    say(f"wrote {path}: {len(found)} of {len(QUESTIONS)} studies" + (f" ({len(missing)} not run yet)" if missing
                                                                       else ""))
    return path


def _cpu_s() -> float:
    """User + system CPU seconds of this process and the children it has waited for (the search's
    forked workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


__all__ = ["QUESTIONS", "SIZES", "run_all", "run_study", "write_report"]
