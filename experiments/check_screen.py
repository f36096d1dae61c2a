"""Does the search's screening pass lose the best plans?  The search screens every degree tuple
with one representative plan and refines the best ``SearchOptions.refine`` (default 12) fully;
this script runs each case twice in one process, with the default budget and with every tuple
refined, and prints whether the top-K plans and their step times agree.

    python experiments/check_screen.py [--cases gpt3-175b:h100x1024 ...] [--top-k 5]
"""
from __future__ import annotations

import argparse
import time

from autoplan.search import SearchOptions, search
from autoplan.workload import Workload

CASES = ("gpt3-175b:h100x1024", "llama3-70b:h100x1024", "llama3-8b:h100x64", "mixtral-8x7b:h100x256")


def run(case: str, top_k: int) -> dict:
    model, cluster = case.split(":")
    w = Workload.load(model, cluster)
    out = {}
    for name, refine in (("default", SearchOptions().refine), ("all", 10**9)):
        t0 = time.perf_counter()
        res = search(w.model, w.cluster, global_batch=w.global_batch, options=SearchOptions(top_k=top_k, refine=refine))
        out[name] = ([c.plan.to_string() for c in res.candidates], [c.estimate.step_time_s for c in res.candidates],
                     time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--top-k", type=int, default=5)
    args = ap.parse_args()
    print(f"{'case':28} {'same top-1':>10} {'same top-K':>10} {'best Δ':>9} {'K-th Δ':>9} {'s default':>9} "
          f"{'s all':>7}")
    for case in args.cases:
        r = run(case, args.top_k)
        (pd, td, sd), (pa, ta, sa) = r["default"], r["all"]
        print(f"{case:28} {str(pd[:1] == pa[:1]):>10} {str(pd == pa):>10} {td[0] / ta[0] - 1:>+9.2%} "
              f"{td[-1] / ta[-1] - 1:>+9.2%} {sd:>9.1f} {sa:>7.1f}")


if __name__ == "__main__":
    main()
