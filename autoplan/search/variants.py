"""The variants of one degree tuple (tp, cp, ep, pp, dp), searched in one task of the mesh search.

    search_tuple(worker, TupleSearch(meshes, global_batch, options, threshold, screen))
    refine_tuple(est, variants, global_batch, options, threshold, screen) -> [MeshResult, ...]

A tuple's variants differ in ZeRO stage, SP, CP algorithm, axis order and precision; each is a
mesh whose best plan ``stages.best_plan`` finds under the pruning threshold.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import Estimator
from autoplan.errors import UserError
from autoplan.search.executor import Worker
from autoplan.search.records import SearchOptions
from autoplan.search.space import MeshChoice
from autoplan.search.stages import MeshResult, best_plan


@dataclass(frozen=True)
class TupleSearch:
    """What ``refine_tuple`` searches in one task: a tuple's variants at a pruning threshold."""

    meshes: tuple[MeshChoice, ...]
    global_batch: int
    options: SearchOptions
    threshold: float
    screen: bool


def search_tuple(worker: Worker, task: TupleSearch) -> list[MeshResult]:
    """``refine_tuple`` of ``task``, in the process of ``worker`` (a task of the search's executor)."""
    return refine_tuple(worker.est, list(task.meshes), task.global_batch, task.options, task.threshold, task.screen)


def holds(results: list[MeshResult], task: TupleSearch) -> bool:
    """Whether ``results``, run at a higher threshold, are the ones ``task``'s threshold gives."""
    return all(r.same_below(task.threshold) for r in results)


def refine_tuple(est: Estimator, variants: list[MeshChoice], global_batch: int, options: SearchOptions,
                 threshold: float, screen: bool) -> list[MeshResult]:
    """Search the variants of one degree tuple.

    Screening evaluates the first variant (ZeRO-3 if it fits nowhere).  Refining walks the
    (SP, CP algorithm) variants with the first axis order and ZeRO-1; ZeRO-2/3 are searched
    only where ZeRO-1 was memory-limited (they trade communication for memory, so they cannot
    win otherwise); the other axis orders re-price the tuple's best plan (an order changes
    only the data-parallel and pipeline groups' links, never a stage's work or memory)."""
    def run(mesh: MeshChoice) -> MeshResult:
        return best_plan(est, mesh, global_batch, mbs_choices=options.mbs, schedules=options.schedules,
                         max_vpp=options.max_vpp, threshold=threshold, screen=screen,
                         recompute=options.constraints.recompute)

    if screen:
        # the representative, then — while memory binds — the next ZeRO stages of the same variant
        out: list[MeshResult] = [run(variants[0])]
        for z in (2, 3):
            last = out[-1]
            if last.pruned or not (last.plan is None or last.memory_limited):
                break
            nxt = next((v for v in variants if v.zero == z and v.sp == last.mesh.sp
                        and v.cp_algo == last.mesh.cp_algo and v.ulysses == last.mesh.ulysses
                        and v.order == last.mesh.order and v.precision == last.mesh.precision), None)
            if nxt is not None:
                out.append(run(nxt))
        return out
    out = []
    orders = sorted({v.order for v in variants}, key=lambda o: [v.order for v in variants].index(o))
    base_order = orders[0]
    precisions = list(dict.fromkeys(v.precision for v in variants))        # the search's order
    families = sorted({(v.sp, v.cp_algo, v.ulysses, v.precision) for v in variants},
                      key=lambda f: (not f[0], f[1], f[2], precisions.index(f[3])))
    for sp, algo, split, precision in families:
        family = [v for v in variants if v.sp == sp and v.cp_algo == algo and v.ulysses == split
                  and v.precision == precision and v.order == base_order]
        zeros = sorted({v.zero for v in family})
        first_zero = 1 if 1 in zeros else zeros[0]
        result = run(next(v for v in family if v.zero == first_zero))
        out.append(result)
        if result.plan is None or result.memory_limited:
            for z in zeros:
                if z != first_zero:
                    out.append(run(next(v for v in family if v.zero == z)))
    fitting = [r for r in out if r.plan is not None]
    if fitting:
        best = min(fitting, key=lambda r: (r.found_estimate.step_time_s, r.found_plan.to_string()))
        for order in orders[1:]:
            plan = best.found_plan.replace(order=order)
            try:
                e = est.estimate(plan, global_batch, detail=False)     # in full where shown (``detailed``)
            except UserError:
                continue
            mesh = MeshChoice(best.mesh.tp, best.mesh.cp, best.mesh.ep, best.mesh.pp, best.mesh.dp,
                              best.mesh.zero, best.mesh.sp, best.mesh.cp_algo, order, best.mesh.ulysses,
                              best.mesh.precision, best.mesh.etp)
            out.append(MeshResult(mesh, plan, e, 0.0, 1) if e.fits else MeshResult(mesh, None, None, 0.0, 1))
    return out
