"""Run a suite case by case, caching each finished case, then write every output.

    run_suite(cases, out_dir, *, suite, command, force=False, workers=0, search_timeout_s=900,
              results_md=None, log=print) -> list[dict]

Each case's record is written to ``OUT/cases/<name>.json`` as soon as the case finishes
(also when it failed: a failure is a result, logged with its error).  A later run reuses a
cached record when the case's definition is unchanged, so an interrupted suite resumes
where it stopped; ``force`` re-runs every selected case.  After the cases: results.json,
results.csv, the three plots and table.md in ``OUT``, and, with ``results_md``, the bench
section of that Markdown file (other sections untouched).  The outputs cover every case
cached in ``OUT`` that belongs to the suite, not only the ones selected this time.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import autoplan
from autoplan.atomic import write_section
from autoplan.bench.case import run_case
from autoplan.bench.plots import write_plots
from autoplan.bench.report import markdown, results_csv, results_json
from autoplan.bench.suite import Case
from autoplan.cost import rounded
from autoplan.errors import UserError


def run_suite(cases: tuple[Case, ...], out_dir: str, *, suite: str, all_cases: tuple[Case, ...], command: str,
              force: bool = False, workers: int = 0, search_timeout_s: float = 900.0,
              results_md: str | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """Run (or reuse) ``cases``; write the outputs over ``all_cases`` found in ``out_dir``."""
    cache = os.path.join(out_dir, "cases")
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output folder {out_dir}: {e}", "pass --out DIR with a writable DIR") \
            from None
    for i, case in enumerate(cases, 1):
        path = os.path.join(cache, f"{case.name}.json")
        prefix = f"[{i}/{len(cases)}] {case.name}"
        cached = None if force else load_cached(path, case)
        if cached is not None:
            log(f"{prefix}: cached ({describe(cached)}); --force re-runs it")
            continue
        log(f"{prefix}: {case.model} on {case.cluster}, seq {case.seq:,}, global batch {case.global_batch:,} …")
        start = time.perf_counter()
        record = run_case(case, workers=workers, search_timeout_s=search_timeout_s)
        _write(path, json.dumps(rounded(record), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        log(f"{prefix}: {describe(record)} [{time.perf_counter() - start:.0f} s]")
    records = [r for r in (load_cached(os.path.join(cache, f"{c.name}.json"), c) for c in all_cases) if r]
    write_outputs(records, out_dir, suite=suite, command=command, results_md=results_md)
    return records


def load_cached(path: str, case: Case) -> dict | None:
    """The cached record of ``case``, or None when absent, unreadable or made for another definition."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if record.get("case") == case.to_dict() else None


def describe(record: dict) -> str:
    """One log line: the outcome of a case."""
    if record["status"] != "ok" and not record.get("contenders"):
        return f"FAILED: {record['error']}"
    rows = {r["contender"]: r for r in record["contenders"]}
    auto = rows["auto"]
    parts = []
    if auto["status"] == "ok":
        parts.append(f"auto {auto['mfu']:.1%} MFU, search {record['search_s']:.1f} s")
    else:
        parts.append(f"FAILED: {record['error']}")
    hand = record.get("best_hand")
    if hand:
        parts.append(f"best recipe {hand} {rows[hand]['mfu']:.1%}")
    if rows["grid"]["status"] == "ok":
        parts.append(f"grid {rows['grid']['mfu']:.1%}")
    if record.get("auto_vs_hand") is not None:
        parts.append(f"auto/hand {record['auto_vs_hand']:.2f}")
    if record.get("auto_vs_grid") is not None:
        parts.append(f"auto/grid {record['auto_vs_grid']:.2f}")
    return ", ".join(parts)


def write_outputs(records: list[dict], out_dir: str, *, suite: str, command: str, results_md: str | None) -> None:
    _write(os.path.join(out_dir, "results.json"), results_json(suite, command, autoplan.__version__, records))
    _write(os.path.join(out_dir, "results.csv"), results_csv(records))
    files = write_plots(records, out_dir) if records else {}
    _write(os.path.join(out_dir, "table.md"), markdown(records, command=command, plots=files))
    if results_md:
        where = os.path.dirname(os.path.abspath(results_md))
        links = {title: os.path.relpath(os.path.join(os.path.abspath(out_dir), name), where)
                 for title, name in files.items()}
        try:
            write_section(results_md, "bench", markdown(records, command=command, plots=links))
        except OSError as e:
            raise UserError(f"cannot write {results_md}: {e}", "pass --results-md with a writable path") from None


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e}", "pass --out DIR with a writable DIR") from None
