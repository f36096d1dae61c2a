"""The search: from a traced model and a cluster to the K best distinct plans.

    search(model, cluster, global_batch=..., options=SearchOptions()) -> SearchResult

Three nested searches, each exact for the cost model it is given:

1. **Operator sharding** (``sharding``, ``presolve``): per block kind and tp sub-mesh, an ILP
   picks every ATen op's layout on the tp axis; solved once, re-priced for every micro-batch
   size and recompute policy.
2. **Pipeline** (``stages``): per mesh, the micro-batch size, schedule, virtual stages, stage
   cuts and per-stage recomputation.
3. **Mesh** (this module, over ``space``'s meshes under the hard NVLink-domain rules): a mesh
   whose model states cannot fit is dropped; the others are explored best-first by an admissible
   lower bound on their step time (``lower_bound``: the busiest rank's compute and unavoidable
   per-layer communication, no bubble, no exposed DP), and a mesh whose bound cannot beat the
   K-th best distinct mesh found so far is pruned.  Each degree tuple (tp, cp, ep, pp, dp) is
   first screened with one variant; the best tuples are then refined over every variant.

Top-K returns distinct meshes: the best plan of each.  With bands on (``samples`` > 0) the
robust pool (``pool``) is priced on the run's paired samples and ranked by ``objective``
(``robust``).  Ties are broken by the plan string, so the same inputs give the same output byte
for byte.  The tasks run on an ``executor`` (here, or in forked workers): the batches, thresholds
and results are the same either way.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from functools import partial

from autoplan.cost import Estimator
from autoplan.errors import UserError
from autoplan.gc_pause import cyclic_gc_paused
from autoplan.ir import BlockGraph
from autoplan.search.bounds import Bounded, SortKey, bound_meshes
from autoplan.search.choose import choose
from autoplan.search.executor import LOOK_AHEAD, Executor, Job, open_executor
from autoplan.search.presolve import ilp_records, solve_layouts
from autoplan.search.progress import Progress, progress_bar
from autoplan.search.records import Candidate, Explored, SearchOptions, SearchResult, SearchStats
from autoplan.search.space import MeshChoice, MeshKey, enumerate_meshes
from autoplan.search.stages import MeshResult
from autoplan.search.variants import TupleSearch, holds, search_tuple
from costmodels.memory import GIB
from topologies.cluster import Cluster

log = logging.getLogger(__name__)


def search(model: BlockGraph, cluster: Cluster, *, global_batch: int, options: SearchOptions = SearchOptions(),
           look_ahead: int = LOOK_AHEAD) -> SearchResult:
    """The ``options.top_k`` best distinct meshes' plans.  ``look_ahead``: tasks per forked worker
    started ahead (``executor``; 0: wait for every batch, the reference; the result is the same)."""
    with cyclic_gc_paused():
        start = time.perf_counter()
        est = Estimator(model, cluster, options.estimate, enforce_rules=True)
        meshes, space = enumerate_meshes(model.model, model.num_layers, cluster, seq=model.sample_positions,
                                         global_batch=global_batch, zero_levels=options.zero,
                                         allow_cross_domain=options.estimate.allow_cross_domain,
                                         precisions=options.precisions,
                                         constraints=options.constraints)
        if not meshes:
            bound = "" if options.constraints.any else f" under the constraints ({options.constraints.describe()})"
            raise UserError(f"no mesh of {cluster.num_gpus} GPUs fits the rules for this model{bound} "
                            f"(heads {model.model.heads}, global batch {global_batch})",
                            "change --global-batch so that data parallelism can divide it"
                            + ("" if options.constraints.any else ", or loosen the constraints"))
        log.info("%s on %s: %d meshes after the NVLink rules (%d degree choices broke them)",
                 model.model.name, cluster.name, len(meshes), space.broke_rules)
        workers = options.worker_count
        breaking = _rule_breaking_meshes(model, cluster, global_batch, options, meshes)
        solve_layouts(est, meshes + breaking, global_batch, options.mbs, workers)
        bounds = bound_meshes(est, meshes, global_batch, options.mbs)
        log.info("%d meshes cannot hold their model states; %d to explore best-first by their bound",
                 bounds.pruned_memory, len(bounds.meshes))
        # one set of workers for the rest: what a worker compiled while exploring (schedule orders,
        # periods, live walks, stage prices) it still holds when it hedges, details and bands
        worth_forking = len(bounds.meshes) > workers or options.samples > 0
        with open_executor(est, workers, worth_forking=worth_forking, look_ahead=look_ahead) as executor:
            run = _Run(est, global_batch, options, executor)
            found = _explore(run, bounds.meshes, start)
            if not found.best:
                raise UserError(_no_fit_message(est, found.counters.shortfall_gib, bounds.least_states_gib,
                                                options), _no_fit_fix(options))
            ranked = sorted(found.best.values(), key=_rank_key)
            chosen = choose(est, executor, ranked, found.variants, global_batch, options)
            broken = _best_rule_breaking(run, breaking, start) if breaking else None
        ilps, c = ilp_records(est), found.counters
        stats = SearchStats(space, bounds.pruned_memory, c.pruned, c.evaluated, c.priced,
                            time.perf_counter() - start, ilps)
        return SearchResult(chosen.candidates, stats, max((i.gap for i in ilps), default=0.0), chosen.pool, broken)


RULE_BREAKING_TUPLES = 4
"""Degree tuples of rule-breaking meshes an MoE search prices (those with the least step bound)
for its one line on what the NVLink rule costs (``_best_rule_breaking``)."""
EXPERT_RULES = ("ep-inside-nvlink", "etp-inside-nvlink")


def _rule_breaking_meshes(model: BlockGraph, cluster: Cluster, global_batch: int, options: SearchOptions,
                          legal: list[MeshChoice]) -> list[MeshChoice]:
    """The meshes an MoE search under the NVLink rule leaves out only because their expert groups
    leave the NVLink domain (cross-node EP, what frontier MoE runs do with DeepEP): every other
    per-layer group inside it.  None for a dense model, or when the rule is lifted."""
    from autoplan.mesh import Mesh
    from autoplan.rules import nvlink_breaks

    if not model.model.experts or options.estimate.allow_cross_domain:
        return []
    every, _ = enumerate_meshes(model.model, model.num_layers, cluster, seq=model.sample_positions,
                                global_batch=global_batch, zero_levels=options.zero, allow_cross_domain=True,
                                precisions=options.precisions, constraints=options.constraints)
    kept = set(legal)
    out = []
    for m in every:
        if m in kept or m.ep == 1:
            continue
        plan = m.plan(mbs=1, schedule="1f1b", vpp=1)
        breaks = nvlink_breaks(plan, Mesh.of(plan), experts=model.model.experts, nvlink_domain=cluster.nvlink_domain)
        if breaks and all(g.rule in EXPERT_RULES for g, _ in breaks):
            out.append(m)
    return out


def _best_rule_breaking(run: _Run, meshes: list[MeshChoice], started: float) -> Candidate | None:
    """The fastest plan of the ``RULE_BREAKING_TUPLES`` rule-breaking degree tuples with the least
    bound (``_rule_breaking_meshes``), searched as the main search searches one: every variant and
    the pipeline space; None when none fits."""
    bounds = bound_meshes(run.est, meshes, run.global_batch, run.options.mbs)
    keys: list[MeshKey] = []
    for b in bounds.meshes:
        if b.mesh.key not in keys:
            keys.append(b.mesh.key)
    chosen = set(keys[:RULE_BREAKING_TUPLES])
    probe = _Run(run.est, run.global_batch, replace(run.options, top_k=1, refine=RULE_BREAKING_TUPLES, progress=False),
                 run.executor)
    found = _explore(probe, [b for b in bounds.meshes if b.mesh.key in chosen], started)
    if not found.best:
        return None
    best = min(found.best.values(), key=_rank_key)
    return Candidate(best.found_plan, best.found_estimate)


# Tasks per best-first batch.  A batch runs at the threshold the batches before it leave, so the
# batch, not the number of workers, shapes the result; more workers than a batch are kept busy by
# the executor's look-ahead, which changes no result.
BATCH = 2


@dataclass(frozen=True)
class _Run:
    """What every step of one search reads."""

    est: Estimator
    global_batch: int
    options: SearchOptions
    executor: Executor


@dataclass(frozen=True)
class _Task:
    """A degree tuple to search: its bound (the least of its variants'), key and variants."""

    bound: float
    key: MeshKey
    meshes: tuple[MeshChoice, ...]


# --- screen and refine ---------------------------------------------------------------------------

def _explore(run: _Run, bounded: list[Bounded], started: float) -> Explored:
    """Screen every degree tuple with a representative variant, then search the best tuples fully.

    Pass 1 (screen): for each (tp, cp, ep, pp, dp), one variant (``_representative``; ZeRO-3 when
    that does not fit) over a representative few schedules.  Pass 2 (refine, ``refine_tuple``):
    the best ``refine`` tuples get every variant and the full pipeline space.  Both passes go
    best-first by the bound, ``BATCH`` tasks at a time, and prune against the K-th best distinct
    mesh so far.  With no more tuples than the refine budget, every tuple is refined."""
    options = run.options
    tuples: dict[MeshKey, list[Bounded]] = {}
    for b in bounded:
        tuples.setdefault(b.mesh.key, []).append(b)
    refine_n = max(2 * options.top_k, options.refine)
    found = Explored()
    progress = progress_bar(options.progress, len(tuples) + min(refine_n, len(tuples)), started)
    try:
        screened: dict[MeshKey, MeshResult] = {}
        chosen = sorted(tuples)
        if len(tuples) > refine_n:
            screened = _best_first(run, _screen_tasks(tuples), BATCH, found, progress, screen=True)
            chosen = sorted(tuples, key=lambda k: (screened[k].found_estimate.step_time_s if k in screened
                                                   else float("inf"), k))[:refine_n]
            log.info("screen: %d degree tuples, %d fit; refining the best %d", len(tuples), len(screened),
                     len(chosen))
        tasks = _refine_tasks(tuples, chosen)
        # after a screen the threshold is already tight: refine every chosen tuple in one batch, so
        # that no worker idles waiting for the slowest of a small batch
        _best_first(run, tasks, len(tasks) if screened else BATCH, found, progress, screen=False)
        log.info("refine: %d meshes evaluated, %d pruned, %d plans priced", found.counters.evaluated,
                 found.counters.pruned, found.counters.priced)
    finally:
        progress.stop()
    return found


def _screen_tasks(tuples: dict[MeshKey, list[Bounded]]) -> list[_Task]:
    """Per tuple, its representative variant then the others (``refine_tuple`` screens the first,
    and the next ZeRO stages where memory binds), by the representatives' bounds."""
    reps = sorted(((_representative(v), v) for v in tuples.values()), key=lambda t: (t[0].bound, t[0].sort_key))
    return [_Task(rep.bound, rep.mesh.key, (rep.mesh, *(b.mesh for b in v if b is not rep))) for rep, v in reps]


def _representative(variants: list[Bounded]) -> Bounded:
    """The variant a tuple is screened with: ZeRO-1, SP on, ring, first order, the search's first
    precision (else the closest)."""
    first_order, first_precision = variants[0].mesh.order, variants[0].mesh.precision
    return min(variants, key=lambda b: (b.mesh.zero != 1, not b.mesh.sp, b.mesh.cp_algo != "ring", b.mesh.ulysses,
                                        b.mesh.order != first_order, b.mesh.precision != first_precision,
                                        b.sort_key))


def _sort_key(b: Bounded) -> SortKey:
    return b.sort_key


def _refine_tasks(tuples: dict[MeshKey, list[Bounded]], chosen: list[MeshKey]) -> list[_Task]:
    """Per chosen tuple, every variant in mesh order, by the least bound of its variants."""
    tasks = [_Task(min(b.bound for b in tuples[k]), k, tuple(b.mesh for b in sorted(tuples[k], key=_sort_key)))
             for k in chosen]
    return sorted(tasks, key=lambda t: (t.bound, t.key))


def _best_first(run: _Run, tasks: list[_Task], batch: int, found: Explored, progress: Progress, *,
                screen: bool) -> dict[MeshKey, MeshResult]:
    """Run ``tasks`` best-first, ``batch`` at a time, each batch at the K-th best so far (the
    pruning threshold); merge their results into ``found``; the best result per tuple of this pass."""
    best_here: dict[MeshKey, MeshResult] = {}
    batches = run.executor.best_first(search_tuple, holds)
    i = 0
    while i < len(tasks):
        kth = _kth_best(found.best, run.options.top_k)
        chosen, i, pruned = _next_batch(tasks, i, batch, kth, found.best)
        if pruned:
            log.debug("%d tuples pruned: their bound reaches the K-th best, %.4g s", pruned, kth)
        found.counters.pruned += pruned
        progress.advance(pruned)
        if chosen:
            upcoming = partial(_upcoming, run, tasks, i, batch, found.best, screen)
            for results in batches.run(_jobs(run, chosen, kth, screen), upcoming):
                progress.advance()
                _merge(results, found, best_here)
    return best_here


def _next_batch(tasks: list[_Task], i: int, batch: int, kth: float,
                best: dict[MeshKey, MeshResult]) -> tuple[list[tuple[int, _Task]], int, int]:
    """From task ``i`` on, the next ``batch`` tasks a threshold of ``kth`` does not prune: ((index,
    task) each, the index after them, how many were pruned on the way).  A task is pruned where
    its bound reaches both the threshold and its tuple's best so far."""
    chosen: list[tuple[int, _Task]] = []
    pruned = 0
    while i < len(tasks) and len(chosen) < batch:
        current = best.get(tasks[i].key)
        if tasks[i].bound >= kth and (current is None or tasks[i].bound >= current.found_estimate.step_time_s):
            pruned += 1
        else:
            chosen.append((i, tasks[i]))
        i += 1
    return chosen, i, pruned


def _upcoming(run: _Run, tasks: list[_Task], i: int, batch: int, best: dict[MeshKey, MeshResult], screen: bool,
              done: list[list[MeshResult]], count: int) -> list[Job[TupleSearch]]:
    """The jobs of the batches after task ``i``, whole batches until ``count`` jobs, at the threshold
    that ``best`` and the current batch's results ``done`` so far give (what the executor may
    start ahead)."""
    merged = dict(best)
    for out in (out for results in done for out in results if out.plan is not None):
        _keep_best(out, merged)
    kth = _kth_best(merged, run.options.top_k)
    jobs: list[Job[TupleSearch]] = []
    while len(jobs) < count and i < len(tasks):
        chosen, i, _ = _next_batch(tasks, i, batch, kth, merged)
        jobs += _jobs(run, chosen, kth, screen)
    return jobs


def _jobs(run: _Run, chosen: list[tuple[int, _Task]], threshold: float, screen: bool) -> list[Job[TupleSearch]]:
    """The executor's jobs for the (index, task) pairs ``chosen``, at ``threshold``."""
    return [Job(k, TupleSearch(t.meshes, run.global_batch, run.options, threshold, screen)) for k, t in chosen]


def _merge(results: list[MeshResult], found: Explored, best_here: dict[MeshKey, MeshResult]) -> None:
    """One task's results into the best per tuple (``found.best``, ``best_here``) and the counts."""
    counters = found.counters
    for out in results:
        if log.isEnabledFor(logging.DEBUG):        # the line is built only when -vv shows it
            log.debug("%s", _described(out))
        counters.evaluated += 1
        counters.priced += out.evaluated
        if out.plan is None:
            if out.pruned:
                counters.pruned += 1
            else:
                counters.shortfall_gib = min(counters.shortfall_gib, out.shortfall_gib)
            continue
        found.variants[out.plan.to_string()] = out
        _keep_best(out, found.best, best_here)


def _described(out: MeshResult) -> str:
    """One mesh's outcome in a line (``-vv``)."""
    m = out.mesh
    name = (f"tp{m.tp}·cp{m.cp}·ep{m.ep}{'' if m.etp is None else f'·etp{m.etp}'}·pp{m.pp}·dp{m.dp} zero{m.zero}"
            f"{' sp' * m.sp}"
            f"{' ' + m.cp_algo if m.cp > 1 else ''}{f' ulysses={m.ulysses}' if m.ulysses else ''}"
            f" order={'-'.join(m.order)}{f' {m.precision}' if m.precision != 'bf16' else ''}")
    if out.plan is not None:
        return f"{name}: {out.found_estimate.step_time_s:.4g} s, {out.plan.to_compact()} ({out.evaluated} plans priced)"
    if out.pruned:
        return f"{name}: every micro-batch size bounded out"
    return f"{name}: fits nowhere, {out.shortfall_gib:.1f} GiB short ({out.evaluated} plans priced)"


def _keep_best(out: MeshResult, *tables: dict[MeshKey, MeshResult]) -> None:
    """``out`` into each table of the best result per tuple, where it beats the one there."""
    for table in tables:
        prev = table.get(out.mesh.key)
        if prev is None or _rank_key(out) < _rank_key(prev):
            table[out.mesh.key] = out


def _rank_key(r: MeshResult) -> tuple[float, str]:
    return (r.found_estimate.step_time_s, r.found_plan.to_string())


def _kth_best(best: dict[MeshKey, MeshResult], k: int) -> float:
    if len(best) < k:
        return float("inf")
    return sorted(r.found_estimate.step_time_s for r in best.values())[k - 1]


def _no_fit_message(est: Estimator, shortfall: float, least_states: float, options: SearchOptions) -> str:
    """``shortfall``: the least GiB over HBM of a plan priced (inf: none was), else
    ``least_states``, the smallest model-state floor of any mesh (``states_floor``)."""
    hbm = est.usable_bytes / GIB
    if shortfall == float("inf"):
        shortfall = least_states - hbm
    bound = "" if options.constraints.any else f" under the constraints ({options.constraints.describe()})"
    return (f"{est.model.model.name} fits no plan on {est.cluster.name}{bound}: the closest plan needs "
            f"{shortfall:.1f} GiB more than the {hbm:.1f} GiB of HBM per GPU left by the "
            f"{est.options.memory_margin_gib:g} GiB memory margin")


_NO_FIT_FIX = ("use more GPUs (or GPUs with more memory), a shorter --seq or a smaller --global-batch; "
               "ZeRO-3, full recomputation and the largest pipeline were already tried")


def _no_fit_fix(options: SearchOptions) -> str:
    if options.constraints.any:
        return _NO_FIT_FIX
    return (f"loosen the constraints ({options.constraints.describe()}), or use more GPUs (or GPUs with more "
            "memory), a shorter --seq or a smaller --global-batch")
