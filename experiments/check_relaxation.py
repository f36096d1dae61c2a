"""Does the block ILP's LP relaxation certify the optimum, and what does it save? (issue 17)

    python experiments/check_relaxation.py [--case MODEL@CLUSTER ...] [--write]

For each case (the worst-case search rows of ``bench_search.py --worst``) it collects every
distinct block ILP the search solves (``presolve.solve_layouts``, tp > 1), then in one process solves
each twice: by ``relaxation.solve_relaxation`` (GLOP) and by CP-SAT alone (``ilp._solve_cpsat``,
the path before the relaxation).  It reports how many the relaxation certified, the largest
relative objective difference against CP-SAT (positive: the relaxation's is worse), how many
chose another assignment among tied optima, and both solvers' seconds with their ratio.
``--write`` puts the table into RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_search import WORST_CASES, _machine  # noqa: E402
from results_md import write_section  # noqa: E402


def problems(model: str, cluster: str, seq: int, batch: int) -> list:
    """Every distinct block ILP (``ilp.IlpProblem``, with its time limit) the search of the case solves."""
    from autoplan.cost import Estimator
    from autoplan.frontend import trace
    from autoplan.search import SearchOptions
    from autoplan.search.presolve import solve_layouts
    from autoplan.search.space import enumerate_meshes
    from autoplan.sharding import ilp
    from autoplan.workload import load_cluster

    graph, c = trace(model, seq=seq), load_cluster(cluster)
    options = SearchOptions(workers=1)
    est = Estimator(graph, c, options.estimate, enforce_rules=True)
    meshes, _ = enumerate_meshes(graph.model, graph.num_layers, c, seq=graph.sample_positions, global_batch=batch,
                                 allow_cross_domain=False, zero_levels=options.zero)
    from autoplan.sharding import solve as solved
    # this case's every ILP, not only those an earlier case did not meet (memo() adds cache_clear)
    solved.solve_problem.cache_clear()   # type: ignore[attr-defined]
    seen: list = []
    solve = ilp.solve

    def record(problem, backend="cpsat", time_limit_s=30.0):
        seen.append((problem, time_limit_s))
        return solve(problem, backend, time_limit_s)
    ilp.solve = record
    try:
        solve_layouts(est, meshes, batch, options.mbs, 1)
    finally:
        ilp.solve = solve
    return seen


def check(case: tuple) -> dict:
    from autoplan.sharding import ilp
    from autoplan.sharding.relaxation import solve_relaxation

    model, cluster, seq, batch = case
    found = problems(model, cluster, seq, batch)
    t0 = time.perf_counter()
    relaxed = [solve_relaxation(p) for p, _ in found]
    t1 = time.perf_counter()
    exact = [ilp._solve_cpsat(p, limit) for p, limit in found]
    t2 = time.perf_counter()
    pairs = [(r, e) for r, e in zip(relaxed, exact) if r is not None]
    worst = max(((r.objective - e.objective) / e.objective for r, e in pairs if e.objective > 0), default=0.0)
    return {"model": model, "cluster": cluster, "ilps": len(found), "certified": len(pairs),
            "worst_rel": worst, "other_tie": sum(r.choice != e.choice for r, e in pairs),
            "glop_s": t1 - t0, "cpsat_s": t2 - t1}


def markdown(rows: list[dict]) -> str:
    lines = [f"Every distinct block ILP of each worst-case search, solved twice in one process "
             f"({_machine()}; `python experiments/check_relaxation.py --write`): by its LP relaxation "
             "(GLOP, `autoplan/sharding/relaxation.py`) and by CP-SAT alone (the path before it).  "
             "*certified*: the relaxation's optimum was integral and its assignment's objective equals "
             "the LP bound; *worst Δ*: the largest (relaxation − CP-SAT) / CP-SAT objective (CP-SAT rounds "
             "every cost to the nanosecond); *other tie*: ILPs where it chose another assignment of the "
             "same objective.  An ILP the relaxation does not certify is solved by CP-SAT in the search.",
             "",
             "| model | cluster | ILPs | certified | worst Δ | other tie | GLOP s | CP-SAT s | CP-SAT / GLOP |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['cluster']} | {r['ilps']} | {r['certified']} | {r['worst_rel']:.1e} | "
                     f"{r['other_tie']} | {r['glop_s']:.2f} | {r['cpsat_s']:.2f} | "
                     f"{r['cpsat_s'] / max(r['glop_s'], 1e-9):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", default=[], help="MODEL@CLUSTER (default: every worst case)")
    ap.add_argument("--write", action="store_true", help="write the table into experiments/RESULTS.md")
    args = ap.parse_args(argv)
    cases = [c for c in WORST_CASES if not args.case or f"{c[0]}@{c[1]}" in args.case]
    rows = []
    for case in cases:
        row = check(case)
        rows.append(row)
        print(f"{row['model']:>12} {row['cluster']:>12}  ILPs {row['ilps']:4d}  certified {row['certified']:4d}  "
              f"worst {row['worst_rel']:+.1e}  other tie {row['other_tie']:4d}  GLOP {row['glop_s']:6.2f} s  "
              f"CP-SAT {row['cpsat_s']:6.2f} s", flush=True)
    text = markdown(rows)
    print(text)
    if args.write:
        write_section("check_relaxation", "Block ILPs: the LP relaxation against CP-SAT "
                      "(`python experiments/check_relaxation.py --write`)", text)


if __name__ == "__main__":
    main()
