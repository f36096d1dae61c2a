"""The block ILPs, solved before the search forks its workers, so that every worker inherits them.

    solve_layouts(est, meshes, global_batch, mbs_choices, workers)   # into est (``store_layouts``)
    ilp_records(est) -> (IlpRecord, ...)                               # what was solved, for the stats

One ILP per (kind, tp, sp, tp span, cp, micro-batch): the keys ``cost.tp.BlockLayouts`` solves on.
They are solved in worker processes when there are more ILPs than workers; CP-SAT with one worker
and a deterministic time limit gives the same solution in any process.
"""
from __future__ import annotations

import logging
import time

from autoplan.cost import Estimator
from autoplan.cost.tp import LayoutKey
from autoplan.plan import Plan
from autoplan.search.executor import Worker, open_executor
from autoplan.search.records import IlpRecord
from autoplan.search.space import MeshChoice
from autoplan.sharding import BlockAssignment
from autoplan.sharding.ilp import load_backend
from topologies.cluster import GroupSpan

log = logging.getLogger(__name__)


def solve_layouts(est: Estimator, meshes: list[MeshChoice], global_batch: int, mbs_choices: tuple[int, ...],
                  workers: int) -> None:
    """Solve every block ILP the meshes need at the micro-batch sizes that divide their local
    batch, and keep the solutions in ``est``."""
    jobs: dict[LayoutKey, tuple[str, Plan]] = {}
    for mesh in meshes:
        for mbs in mbs_choices:
            if (global_batch // mesh.dp) % mbs == 0:
                plan = mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",))
                for key, kind in est.unsolved_layouts(plan):
                    jobs.setdefault(key, (kind, plan))
    # one task per (kind, tp, sp, span): its micro-batch and cp variants are solved in one process,
    # where those that meet on one problem share its solve (``sharding.solve.solve_problem``)
    groups: dict[tuple[str, int, bool, GroupSpan], list[LayoutKey]] = {}
    for key in jobs:
        groups.setdefault((key.graph, key.tp, key.sp, key.span), []).append(key)
    tasks = [[jobs[key] for key in keys] for keys in groups.values()]
    weights = [_task_weight(est, task) for task in tasks]
    if any(weights):
        load_backend(est.options.solver)     # once here, not once per forked worker
    # heaviest tasks first (a worker left with the heaviest one last idles the others), answers
    # put back in task order; each ILP's solution does not depend on the process that solves it
    order = sorted(range(len(tasks)), key=lambda i: (-weights[i], i))
    worth_forking = len(tasks) > 1 and len(jobs) > workers
    start = time.perf_counter()
    with open_executor(est, workers, worth_forking=worth_forking) as executor:
        done = executor.map(_solve_task, [tasks[i] for i in order])
    log.info("presolve: %d block ILPs in %d tasks solved in %.2f s (%s)", len(jobs), len(tasks),
             time.perf_counter() - start, f"{workers} workers" if worth_forking else "in this process")
    solved: list[list[BlockAssignment]] = [[] for _ in tasks]
    for i, answer in zip(order, done):
        solved[i] = answer
    est.store_layouts({key: a for keys, answer in zip(groups.values(), solved) for key, a in zip(keys, answer)})


def _task_weight(est: Estimator, task: list[tuple[str, Plan]]) -> int:
    """How much solving ``task`` costs, roughly: the graph nodes of its ILPs (tp 1 has none)."""
    return sum(len(est.graph(kind).nodes) for kind, plan in task if plan.tp > 1)


def _solve_task(worker: Worker, task: list[tuple[str, Plan]]) -> list[BlockAssignment]:
    return [worker.est.solve_layout(kind, plan) for kind, plan in task]


def ilp_records(est: Estimator) -> tuple[IlpRecord, ...]:
    """One record per block ILP solution ``est`` keeps, by (kind, tp, sp, tp span, mbs, cp)."""
    solved = est.solved_layouts()
    return tuple(IlpRecord(k[0], k[1], k[2], a.ilp_size, a.solve_seconds, a.gap, a.status, k[4], k[5])
                 for k, a in sorted(solved.items(), key=lambda kv: (*kv[0][:3], str(kv[0][3]), *kv[0][4:])))

