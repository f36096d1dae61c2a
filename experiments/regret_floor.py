"""The least worst regret any plan can reach under a scenario set: is a ≤ 5 % pick there at all?

    python experiments/regret_floor.py [--case MODEL@CLUSTER ...] [--bench [NAME,...]] [--scenarios all]
                                       [--reuse JSON] [--json]

``perturbations.py --scenarios`` prices the default pick under each scenario against that
scenario's own best plan.  When the pick's worst regret is over the bound, this asks whether a
pool or a ranking could do better: it prices a wide set of plans — the banded search's robust
pool and, around each of its plans, every split of the pool plan's tp·cp (tp, cp ∈ 1…8, dp
absorbing the rest) × micro-batch size (1, 2, 4) × uniform recompute policy (``RECOMPUTE``, and
``op:N`` for N = 4, 8, … below a virtual stage's layers) × CP algorithm (ring, Ulysses),
schedule, pipeline, ZeRO stage, SP and order kept, each that fits
on the nominal model (memory does not move with the scenario parameters) — under every
scenario, and reports the minimax: the plan whose worst regret is least, and that regret.

Regret of plan p under scenario s = t_s(p) / best_s − 1, best_s the least of the enumerated
plans' times and (``--reuse``) the scenario's own searched best, re-priced.  Enumerating fewer
plans than exist can only make best_s larger than the true best, so each plan's regret here is a
lower bound on its true regret; when even the least worst regret is over the bound, no plan of the
set meets it, and the two scenarios that force it (the ``pinch``: the set's plans within the bound
under one scenario all lose more than the bound under the other) say why.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from perturbations import CASES, MAX_REGRET, bench_cases, earlier_bests, scenarios  # noqa: E402

SPLITS = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4)
CP_ALGOS = ("ring", "ulysses")


def neighbours(plan: Any, num_gpus: int) -> list[Any]:
    """Plans around ``plan`` (module docstring): its tp·cp re-split, mbs, recompute, CP algorithm."""
    from autoplan.errors import UserError
    from autoplan.plan import RECOMPUTE

    out = []
    width = plan.tp * plan.cp * plan.dp
    for tp in SPLITS:
        for cp in SPLITS:
            if width % (tp * cp):
                continue
            for mbs in MICRO_BATCHES:
                for rc in RECOMPUTE:
                    for algo in CP_ALGOS if cp > 1 else ("ring",):
                        try:
                            out.append(plan.replace(tp=tp, cp=cp, dp=width // (tp * cp), mbs=mbs, recompute=(rc,),
                                                    cp_algo=algo, ulysses=0, layers=plan.layers,
                                                    sp=plan.sp if tp > 1 else False))
                        except (UserError, ValueError, TypeError):
                            continue
    return out


def partial_op(plans: list[Any], num_layers: int) -> list[Any]:
    """Each uniform-``op`` plan with ``op:N``, N = 4, 8, … below its largest virtual stage's layers."""
    return [p.replace(recompute=(f"op:{n}",)) for p in plans if p.recompute == ("op",)
            for n in range(4, max(p.stage_layers(num_layers)), 4)]


def candidates(est: Any, pool: list[Any], batch: int, num_gpus: int) -> dict[str, Any]:
    """``{plan string: Plan}`` of the pool and its neighbours (and their ``partial_op`` plans)
    that run and fit on ``est``'s model."""
    from autoplan.errors import UserError

    found: dict[str, Any] = {}
    for base in pool:
        near = [base] + neighbours(base, num_gpus)
        for plan in near + partial_op(near, est.model.num_layers):
            key = plan.to_string()
            if key in found:
                continue
            try:
                if est.estimate(plan, batch, detail=False).fits:
                    found[key] = plan
            except (UserError, ValueError):
                continue
    return found


def price(model: Any, cluster: Any, plans: dict[str, Any], batch: int, which: str) -> dict[str, dict[str, float]]:
    """``{scenario: {plan string: step seconds}}`` over the scenario set ``which``."""
    from autoplan.cost import EstimateOptions, Estimator

    out = {}
    for name, params in scenarios(which).items():
        est = Estimator(model, cluster, EstimateOptions(params=params))
        out[name] = {key: est.step_time_s(plan, batch) for key, plan in plans.items()}
        print(f"  {name}: {len(plans)} plans priced", file=sys.stderr, flush=True)
    return out


def floor(steps: dict[str, dict[str, float]], searched: dict[str, float], pick: str) -> dict[str, Any]:
    """The minimax plan and its worst regret, the pick's, and the pinch (module docstring): the
    plans within the bound under the minimax plan's worst scenario, and the scenario under which
    the least regret among them is greatest."""
    best = {s: min(min(times.values()), searched.get(s, float("inf"))) for s, times in steps.items()}

    def regret(s: str, key: str) -> float:
        return steps[s][key] / best[s] - 1.0

    def worst(key: str) -> tuple[float, str]:
        return max((regret(s, key), s) for s in steps)

    keys = sorted(steps[next(iter(steps))], key=lambda k: (worst(k), k))
    top, (least, scenario) = keys[0], worst(keys[0])
    near = [k for k in keys if regret(scenario, k) <= MAX_REGRET]
    pinch = max((min(regret(s, k) for k in near), s) for s in steps) if near else (float("nan"), "—")
    return {"plans": len(keys), "minimax_plan": top, "minimax_regret": least, "minimax_scenario": scenario,
            "pick": pick, "pick_regret": worst(pick)[0] if pick in steps[scenario] else None,
            "pinch": {"plans": len(near), "their_least_regret": pinch[0], "under": pinch[1]},
            "ok": least <= MAX_REGRET}


def run_case(model_name: str, cluster_name: str, seq: int, batch: int, which: str, reuse: dict) -> dict[str, Any]:
    """One case: the banded search's pool and pick, the candidates, their prices, the floor."""
    from autoplan.cost import Estimator
    from autoplan.frontend import trace
    from autoplan.plan import Plan
    from autoplan.search import SearchOptions, search
    from autoplan.workload import load_cluster

    model, cluster = trace(model_name, seq=seq), load_cluster(cluster_name)
    result = search(model, cluster, global_batch=batch, options=SearchOptions())
    plans = candidates(Estimator(model, cluster), [c.plan for c in result.pool], batch, cluster.num_gpus)
    print(f"{model_name}@{cluster_name}: {len(plans)} plans", file=sys.stderr, flush=True)
    steps = price(model, cluster, plans, batch, which)
    searched = {}
    for name, params in scenarios(which).items():
        earlier = reuse.get((model_name, cluster_name, name))
        if earlier is not None:
            from autoplan.cost import EstimateOptions
            est = Estimator(model, cluster, EstimateOptions(params=params))
            searched[name] = est.step_time_s(Plan.parse(earlier, num_gpus=cluster.num_gpus), batch)
    row = {"model": model_name, "cluster": cluster_name, "seq": seq, "batch": batch}
    return row | floor(steps, searched, result.candidates[0].plan.to_string())


def markdown(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [f"`python experiments/regret_floor.py{cmd}`: the least worst regret of any enumerated plan (the "
             "banded search's pool and, around each pool plan, every tp·cp split × mbs 1/2/4 × uniform recompute "
             "(and op:N) × ring/Ulysses that fits) under the scenario set, against each scenario's best (the "
             "enumerated plans' and its own searched best): a lower bound on each plan's true regret.", "",
             "| case | plans | least worst regret | its plan | its worst scenario | plans within the bound there "
             "| their least regret elsewhere (scenario) | default pick's |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["pinch"]
        pick = "—" if r["pick_regret"] is None else f"{r['pick_regret']:+.1%}"
        lines.append(f"| {r['model']} on {r['cluster']} | {r['plans']} | {r['minimax_regret']:+.1%} | "
                     f"`{r['minimax_plan']}` | {r['minimax_scenario']} | {p['plans']} | "
                     f"{p['their_least_regret']:+.1%} ({p['under']}) | {pick} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", metavar="MODEL@CLUSTER", help="only these cases")
    ap.add_argument("--bench", nargs="?", const="", metavar="NAME,...", help="the bench's cases instead")
    ap.add_argument("--scenarios", default="all", choices=("issue38", "own", "all"))
    ap.add_argument("--reuse", metavar="JSON", help="a perturbations.py --json output: its searched bests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    pool = bench_cases(args.bench or None) if args.bench is not None else CASES
    cases = [c for c in pool if not args.case or f"{c[0]}@{c[1]}" in args.case]
    reuse = earlier_bests(args.reuse)
    rows = [run_case(m, c, seq, batch, args.scenarios, reuse) for m, c, seq, batch in cases]
    cmd = f" --scenarios {args.scenarios}" \
        + (f" --reuse {os.path.relpath(args.reuse, REPO)}" if args.reuse else "") \
        + "".join(f" --case {c}" for c in args.case or ())
    print(json.dumps(rows, indent=2, sort_keys=True) if args.json else markdown(rows, cmd))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
