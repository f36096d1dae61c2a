"""The MoE searches of issue 34: their CPU time, and their best plan against the published layouts.

    python experiments/check_moe_search.py [--only deepseek,qwen] [--workers N]

Each case runs ``autoplan search`` (the CLI, in a fresh process, its trace cached first) and reports
the search's user + system CPU seconds (its workers' included: a loaded machine stretches wall
time, not CPU time), its best plan and the line on the best rule-breaking plan.  The published
layouts of the same model are priced with the search's options (``EstimateOptions()``: the
planner's own kernels, each plan's dispatcher as written), split into those that respect the
NVLink rule and those that break it; the search's best must be at least as fast (as priced) as the
best published layout that respects the rule.

* DeepSeek-V3 on h100x2048 at seq 4,096, global batch 15,360 (DeepSeek-V3's): the published
  layouts are DeepSeek's own (PP16 DualPipe, EP64 across 8 nodes; the ``deepseek`` recipe) and
  Megatron-Bridge's H100 recipe (TP2 PP8 VPP4 EP64, ``deepseek_workload_base_configs.py``), both
  cross-node EP.
* Qwen3-235B-A22B (``experiments/models/qwen3_235b_a22b.py``) on h100x256 at seq 4,096, global
  batch 2,048: the five layouts of the Megatron-Core model zoo (``regimes3_public.json``).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import published_regimes3 as pr3  # noqa: E402
from autoplan.cost import EstimateOptions, Estimator  # noqa: E402
from autoplan.errors import UserError  # noqa: E402
from autoplan.frontend import trace  # noqa: E402
from autoplan.plan import Plan  # noqa: E402
from autoplan.rules import respects_nvlink  # noqa: E402
from autoplan.workload import load_cluster  # noqa: E402

QWEN = os.path.join(REPO, "experiments", "models", "qwen3_235b_a22b.py")
CASES = {
    "deepseek": ("deepseek-v3", "h100x2048", 4096, 15360, {
        "DeepSeek-V3 (PP16 DualPipeV, EP64)": "tp=1,pp=16,dp=128,ep=64,vpp=2,mbs=1,schedule=dualpipev,"
                                              "recompute=selective,dispatcher=deepep",
        "Megatron-Bridge H100 (TP2 PP8 VPP4 EP64)": "tp=2,pp=8,vpp=4,dp=128,ep=64,etp=1,mbs=1,"
                                                    "schedule=interleaved,recompute=selective,dispatcher=deepep",
    }),
    "qwen": (QWEN, "h100x256", 4096, 2048, {}),
}


def qwen_layouts() -> dict[str, str]:
    """The Megatron-Core model zoo's Qwen3-235B layouts on 256 H100, as ``published_regimes3`` writes them."""
    priced, _ = pr3.rows()
    return {r.ident: r.plan for r in priced if r.group == "mcore-qwen3-235b-h100-layouts"}


def run_search(model: str, cluster: str, seq: int, batch: int, workers: int) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of ``autoplan search`` in a fresh process."""
    cmd = [sys.executable, "-m", "autoplan", "search", model, "--cluster", cluster, "--seq", str(seq),
           "--global-batch", str(batch)] + (["--workers", str(workers)] if workers else [])
    env = dict(os.environ, PYTHONPATH=REPO)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall, out


def price(est: Estimator, plan: str, batch: int, num_gpus: int, experts: int, domain: int) -> tuple[float, bool, bool]:
    """(step seconds, fits, respects the NVLink rule) of a published plan under the search's options."""
    p = Plan.parse(plan, num_gpus=num_gpus)
    e = est.estimate(p, batch, detail=False)
    return e.step_time_s, e.fits, respects_nvlink(p, experts=experts, nvlink_domain=domain)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="deepseek,qwen")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    ok = True
    for name in args.only.split(","):
        model, cluster_name, seq, batch, layouts = CASES[name]
        layouts = layouts or qwen_layouts()
        graph = trace(model, seq=seq)
        cluster = load_cluster(cluster_name)
        cpu, wall, out = run_search(model, cluster_name, seq, batch, args.workers)
        lines = out.splitlines()
        best_line = next(line for line in lines if line.startswith("1 "))
        best = float(best_line.split(" s ", 1)[0].rsplit(None, 1)[-1])
        print(f"{name}: search {cpu:.1f} s CPU ({wall:.1f} s wall); #1 {best:.3f} s")
        print("  " + next((line for line in lines if line.startswith("rule-breaking")), "(no rule-breaking line)"))
        est = Estimator(graph, cluster, EstimateOptions())
        legal = []
        for label, plan in layouts.items():
            try:
                step, fits, rule = price(est, plan, batch, cluster.num_gpus, graph.model.experts,
                                         cluster.nvlink_domain)
            except UserError as err:
                print(f"  {label}: refused ({err.problem})")
                continue
            print(f"  {label}: {step:.3f} s{'' if fits else ' (does not fit)'}, "
                  f"{'respects' if rule else 'breaks'} the NVLink rule")
            if rule and fits:
                legal.append(step)
        if legal and best > min(legal) * (1 + 1e-9):
            print(f"  FAIL: #1 {best:.3f} s is slower than the best rule-respecting published layout "
                  f"{min(legal):.3f} s")
            ok = False
        if cpu > 30.0:
            print(f"  FAIL: {cpu:.1f} s CPU > 30 s")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
