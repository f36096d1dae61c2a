"""Search results against torch's memory tracker (issue 12): no search result exceeds HBM − margin.

    python experiments/check_search_memory.py [--top K] [--json] [--write]

For every case of ``CASES`` (zoo model, cluster, sequence, global batch): ``search`` with its
default options (``SearchOptions()``: the 4 GiB margin, the robust objective) and its top-K; then
``autoplan memcheck`` (``apply.memcheck_compare.compare``: the plan applied on fake tensors under the
fake process group at its full world size, two steps under ``MemTracker``) on every plan memcheck
can run.  One row per plan and measured rank kind: the estimate, the tracker's peak, HBM, the margin,
HBM − margin and whether the tracker's peak is at most HBM − margin.  A plan memcheck cannot run
(``apply.memcheck.unsupported``: cp under FSDP, ep, dualpipev) is a row
with the reason.  When none of a case's top-K can run, the case is searched again restricted to
what memcheck runs — ``SearchOptions(schedules=apply.memcheck.PIPELINE_SCHEDULES)``
(cp and ep have no search option; a plan using them stays a skipped row) — and those plans are
checked, so that every case measures something.

No MoE case: when this table was written memcheck did not run expert parallelism, and every
one of mixtral-8x7b's top-5 on h100x64 (seq 4096, global batch 128) uses ep > 1.  Since stop 32
memcheck runs ep for the zoo's capacity-buffer MoE (``apply.memcheck.unsupported``), and apply
shards ep + FSDP as torchtitan does (RESULTS, "MoE, stop 32"); a MoE case waits for the next run
of this script.  The gpt3-175b case's global batch (64) keeps its pipeline ranks' runs short.

A pipeline plan runs two pipeline ranks, the one the estimate puts highest and the last (the
loss), each a row (a rank's run takes about 0.4 s per layer and micro-batch on 2 shared cores:
the cases keep their pipelines' micro-batch counts small).  Exit status 1 when a measured peak exceeds
HBM − margin.  ``--write`` puts the table into experiments/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from autoplan.apply.memcheck import PIPELINE_SCHEDULES  # noqa: E402
from results_md import write_section  # noqa: E402

RESTRICTED = {"schedules": PIPELINE_SCHEDULES}   # what memcheck runs (any zero stage)
TOLERANCE = 0.05          # the bar: estimate within 5 % of the tracker's peak


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    seq: int
    global_batch: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.cluster} s{self.seq} b{self.global_batch}"


CASES = (Case("llama3-8b", "h100x8", 8192, 16),
         Case("llama3-8b", "h100x64", 8192, 128),
         Case("llama3-70b", "h100x64", 8192, 64),
         Case("gpt3-175b", "h100x256", 2048, 64))


@dataclass(frozen=True)
class Row:
    """One plan's rank kind: the search's and memcheck's numbers (GiB), or why it was not run."""
    case: str
    source: str                      # "top-K #i" or "restricted #i"
    plan: str
    search_gib: float                # the search's per-GPU memory for the plan (its highest rank)
    limit_gib: float                 # HBM − margin, as the search reports it
    hbm_gib: float
    margin_gib: float
    pp_rank: int | None = None
    estimate_gib: float | None = None
    tracker_gib: float | None = None
    skipped: str | None = None

    @property
    def measured(self) -> bool:
        return self.tracker_gib is not None

    @property
    def fits(self) -> bool | None:
        """Tracker peak ≤ HBM − margin (None: not measured)."""
        return None if not self.measured else self.tracker_gib <= self.limit_gib  # type: ignore[operator]  # measured

    @property
    def error(self) -> float | None:
        """estimate / tracker − 1."""
        return None if not self.measured else self.estimate_gib / self.tracker_gib - 1.0  # type: ignore[operator]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**d, "fits": self.fits, "error": self.error}


def searched(case: Case, top_k: int, **restrict) -> tuple:
    """(the workload, its top-K candidates) under the default search options (``restrict``: overrides)."""
    from autoplan.search import SearchOptions, search
    from autoplan.workload import Workload

    w = Workload.load(case.model, case.cluster, seq=case.seq, global_batch=case.global_batch)
    options = SearchOptions(top_k=top_k, **restrict)
    return w, list(search(w.model, w.cluster, global_batch=case.global_batch, options=options).candidates)


def measured_ranks(w, plan, global_batch: int, margin_gib: float) -> str | None:
    """``--pp-ranks`` for a pipeline plan: the estimate's highest rank and the last (the loss)."""
    from autoplan.cost import EstimateOptions

    if plan.pp == 1:
        return None
    by_rank = w.estimator(EstimateOptions(memory_margin_gib=margin_gib)).memory_by_rank(plan, global_batch)
    highest = max(range(plan.pp), key=lambda r: by_rank[r].total)
    return ",".join(str(r) for r in sorted({highest, plan.pp - 1}))


def check_candidate(case: Case, w, source: str, candidate) -> list[Row]:
    """memcheck of one search result: a row per measured rank kind, or one row saying why not."""
    from autoplan.apply.memcheck_compare import compare
    from autoplan.errors import UserError

    e = candidate.estimate
    base = dict(case=case.name, source=source, plan=candidate.plan.to_string(), search_gib=e.memory_gib,
                limit_gib=e.memory_limit_gib, hbm_gib=e.hbm_gib, margin_gib=e.memory_margin_gib)
    try:
        out = compare(w, case.model, candidate.plan, seq=case.seq, global_batch=case.global_batch,
                      margin_gib=e.memory_margin_gib,
                      pp_ranks=measured_ranks(w, candidate.plan, case.global_batch, e.memory_margin_gib))
    except UserError as err:
        return [Row(**base, skipped=f"memcheck failed: {err.problem}")]
    if out["skipped"]:
        return [Row(**base, skipped=out["skipped"])]
    pipeline = candidate.plan.pp > 1
    return [Row(**base, pp_rank=k["pp_rank"] if pipeline else None, estimate_gib=k["predicted_gib"]["total"],
                tracker_gib=k["measured_gib"]["total"]) for k in out["rank_kinds"] if k["measured_gib"]]


def check_case(case: Case, top_k: int = 5) -> list[Row]:
    """The case's top-K, each memchecked; plus the restricted search's when none of them ran."""
    w, top = searched(case, top_k)
    rows = [r for i, c in enumerate(top, 1) for r in check_candidate(case, w, f"top-{top_k} #{i}", c)]
    if not any(r.measured for r in rows):
        _, again = searched(case, top_k, **RESTRICTED)
        rows += [r for i, c in enumerate(again, 1) for r in check_candidate(case, w, f"restricted #{i}", c)]
    return rows


def verdict(rows: list[Row]) -> int:
    """Exit status: 1 when a measured peak exceeds HBM − margin, else 0."""
    return 1 if any(r.fits is False for r in rows) else 0


def summary(rows: list[Row]) -> dict:
    """Counts and the worst ratios over the measured rows."""
    got = [r for r in rows if r.measured]
    return {"cases": len({r.case for r in rows}), "plans": len({(r.case, r.plan) for r in rows}),
            "plans_checked": len({(r.case, r.plan) for r in got}), "rank_kinds_measured": len(got),
            # ignore[operator, arg-type]: every row of ``got`` is measured
            "max_tracker_over_limit": max((r.tracker_gib / r.limit_gib for r in got), default=None),  # type: ignore[operator]
            "max_abs_error": max((abs(r.error) for r in got), default=None),  # type: ignore[arg-type]
            "over_limit": sum(r.fits is False for r in got),
            "over_tolerance": sum(abs(r.error) > TOLERANCE for r in got)}  # type: ignore[arg-type]


def markdown(rows: list[Row]) -> str:
    """The rows as a RESULTS.md table (GiB; limit = HBM − margin) and the summary line."""
    lines = ["| case | result | plan | pp rank | search | estimate | tracker | HBM | margin | HBM − margin | "
             "tracker ≤ limit | estimate / tracker − 1 |", "|" + "---|" * 12]
    for r in rows:
        pp = "" if r.pp_rank is None else str(r.pp_rank)
        head = f"| {r.case} | {r.source} | `{r.plan}` | {pp} | {r.search_gib:.2f} |"
        tail = f" {r.hbm_gib:.2f} | {r.margin_gib:g} | {r.limit_gib:.2f} |"
        if r.skipped:
            lines.append(f"{head} | |{tail} not run: {r.skipped} | |")
        else:
            ok = "yes" if r.fits else "**no**"
            lines.append(f"{head} {r.estimate_gib:.2f} | {r.tracker_gib:.2f} |{tail} {ok} | {r.error:+.1%} |")
    s = summary(rows)
    ratio = "-" if s["max_tracker_over_limit"] is None else f"{s['max_tracker_over_limit']:.3f}"
    err = "-" if s["max_abs_error"] is None else f"{s['max_abs_error']:.1%}"
    lines += ["", f"{s['cases']} cases, {s['plans']} plans, {s['plans_checked']} measured "
              f"({s['rank_kinds_measured']} rank kinds); max tracker / (HBM − margin) {ratio}; "
              f"max |estimate / tracker − 1| {err}; over the limit: {s['over_limit']}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=5, metavar="K", help="search results per case (default 5)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--write", action="store_true", help="write the table into experiments/RESULTS.md")
    args = ap.parse_args(argv)
    rows = []
    for case in CASES:
        start = time.perf_counter()
        rows += check_case(case, args.top)
        got = [r for r in rows if r.case == case.name and r.measured]
        print(f"{case.name}: {time.perf_counter() - start:.0f} s, " + ", ".join(
            f"{r.plan} rank {r.pp_rank}: {r.tracker_gib:.2f} tracked / {r.estimate_gib:.2f} estimated"
            for r in got), file=sys.stderr)   # progress; stdout stays the table
    text = markdown(rows)
    if args.write:
        write_section("check_search_memory", "Search results under memcheck "
                      "(`python experiments/check_search_memory.py --write`)", text)
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows], "summary": summary(rows)}, sort_keys=True, indent=1))
    else:
        print(text, end="")
    return verdict(rows)


if __name__ == "__main__":
    sys.exit(main())
