"""Regret of each search objective's choice when the cost model is wrong (issue 13).

    python experiments/perturbations.py [--write] [--case MODEL@CLUSTER ...] [--json]

For each case, the nominal search picks one plan per objective (``point``, ``p50``, ``p90``,
``regret``; the same pool and paired samples for all).  Each perturbation is a parameter file
in ``experiments/perturbations/`` (``{parameter: multiplier}``, the ``--params`` format): the
model under it searches again (point objective, what the perturbed model would pick), and every
objective's nominal choice is priced under it.  Regret = choice's step / perturbed best − 1.
Also: each choice's p50 against the point-optimal plan's p50 (the price of robustness).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from results_md import write_section  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PERTURBATIONS = ("nic", "overlap", "wpass", "half_dim", "all")
CASES = [("gpt3-175b", "h100x1024", 2048, 1536), ("llama3-70b", "h100x1024", 8192, 1024)]


def run_case(model_name: str, cluster_name: str, seq: int, batch: int) -> dict:
    from autoplan.cost import EstimateOptions, Estimator
    from autoplan.cost.params import load_override
    from autoplan.frontend import trace
    from autoplan.search import SearchOptions, search
    from autoplan.search.robust import OBJECTIVES
    from autoplan.workload import load_cluster

    model, cluster = trace(model_name, seq=seq), load_cluster(cluster_name)
    chosen = {}
    for objective in OBJECTIVES:
        c = search(model, cluster, global_batch=batch, options=SearchOptions(objective=objective)).candidates[0]
        chosen[objective] = {"plan": c.plan, "step_s": c.estimate.step_time_s, "p50_s": c.band.step(0.5)}
    row = {"model": model_name, "cluster": cluster_name, "seq": seq, "batch": batch,
           "chosen": {o: {"plan": v["plan"].to_string(), "step_s": v["step_s"], "p50_s": v["p50_s"]}
                      for o, v in chosen.items()}, "perturbed": {}}
    for name in PERTURBATIONS:
        params = load_override(os.path.join(HERE, "perturbations", f"{name}.yaml"))
        best = search(model, cluster, global_batch=batch,
                      options=SearchOptions(objective="point", samples=0, params=params)).candidates[0]
        est = Estimator(model, cluster, EstimateOptions(params=params))
        regrets = {o: est.estimate(v["plan"], batch, detail=False).step_time_s / best.estimate.step_time_s - 1.0
                   for o, v in chosen.items()}
        row["perturbed"][name] = {"best_plan": best.plan.to_string(), "best_s": best.estimate.step_time_s,
                                  "regret": regrets}
        print(f"{model_name}@{cluster_name} {name}: " + ", ".join(f"{o} {r:+.1%}" for o, r in regrets.items()),
              flush=True)
    return row


def markdown(rows: list[dict], cmd: str) -> str:
    from autoplan.search.robust import OBJECTIVES

    lines = [f"`python experiments/perturbations.py{cmd}`: each objective's choice on the nominal model, "
             "its regret under each perturbation (parameter files in `experiments/perturbations/`) against "
             "what the perturbed model's own search picks, and its p50 against the point-optimal plan's p50.", ""]
    for r in rows:
        lines += [f"**{r['model']} on {r['cluster']}** (seq {r['seq']}, global batch {r['batch']})", "",
                  "| objective | plan | " + " | ".join(PERTURBATIONS) + " | worst regret | p50 / point-optimal p50 |",
                  "|" + "---|" * (len(PERTURBATIONS) + 4)]
        p50_point = r["chosen"]["point"]["p50_s"]
        for o in OBJECTIVES:
            regrets = [r["perturbed"][p]["regret"][o] for p in PERTURBATIONS]
            lines.append(f"| {o} | `{r['chosen'][o]['plan']}` | " + " | ".join(f"{x:+.1%}" for x in regrets)
                         + f" | {max(regrets):+.1%} | {r['chosen'][o]['p50_s'] / p50_point:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into experiments/RESULTS.md")
    ap.add_argument("--case", action="append", metavar="MODEL@CLUSTER", help="only these cases")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.case or f"{c[0]}@{c[1]}" in args.case]
    rows = [run_case(*c) for c in cases]
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    cmd = "".join(f" --case {c}" for c in args.case or ())
    text = markdown(rows, cmd)
    print(text)
    if args.write:
        write_section("perturbations", "Robust objectives under perturbed cost models (issue 13)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
