"""The search driver: from a traced model and a cluster to the K best distinct plans.

    search(model, cluster, global_batch=..., options=SearchOptions()) -> SearchResult

Three nested searches, each exact for the cost model it is given:

1. **Operator sharding** (``sharding``, ``ilp``): per unique block kind and tp sub-mesh, an
   ILP picks every ATen op's layout on the tp axis; solved once and cached, re-priced for
   every micro-batch size and recompute policy.
2. **Pipeline** (``stages``): per mesh, the micro-batch size, schedule, virtual stages,
   stage cuts and per-stage recomputation.
3. **Mesh** (``space``): degrees (dp + ZeRO stage, tp + SP, cp + algorithm, ep, pp) and the
   axis order on the hardware, under the hard NVLink-domain rules.  Meshes are explored
   best-first by an admissible lower bound on their step time (``lower_bound``: the busiest
   rank's compute and unavoidable per-layer communication, no bubble, no exposed DP), and a
   mesh whose bound cannot beat the K-th best distinct mesh found so far is pruned.
   Candidates are evaluated in worker processes (forked after the ILPs are solved, so the
   caches are shared) in bound order, a batch at a time.

Top-K returns distinct meshes (tp, cp, ep, pp, dp): the best plan of each.  With bands on
(``samples`` > 0) the robust pool (``pool``: the best ``pool_size`` meshes' variants and schedule
hedges) is priced on the run's paired samples of the uncertain parameters and ranked by
``objective`` (``robust``); ties are broken by the plan string, so the same inputs give the same
output byte for byte.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass

from autoplan.errors import UserError
from autoplan.cost import Estimate, EstimateOptions, Estimator
from autoplan.cost.tp import LayoutKey
from autoplan.cost.evidence import Flag, flags
from autoplan.cost.params import NOMINAL, Params
from autoplan.cost.bounds import states_lower_bound, step_lower_bound
from autoplan.cost.types import DEFAULT_MARGIN_GIB
from autoplan.cost.uncertainty import DEFAULT_SAMPLES, DEFAULT_SEED, Band, Sampler
from autoplan.gc_pause import cyclic_gc_paused
from autoplan.ir import BlockGraph
from autoplan.layout import Layout
from costmodels.memory import GIB
from costmodels.pipeline.shared import sharing
from autoplan.plan import SCHEDULES, Plan
from autoplan.search import robust
from autoplan.search.pool import hedge, robust_pool
from autoplan.search.robust import DEFAULT_OBJECTIVE, OBJECTIVES, Robust
from autoplan.search.space import MeshChoice, SpaceStats, enumerate_meshes
from autoplan.search.stages import MeshResult, best_plan, detailed
from autoplan.sharding.ilp import load_backend
from topologies.cluster import Cluster


@dataclass(frozen=True)
class SearchOptions:
    top_k: int = 5
    solver: str = "cpsat"
    time_limit_s: float = 30.0              # per block ILP
    allow_cross_domain: bool = False
    workers: int = 0                        # 0: one per CPU core
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[str, ...] = SCHEDULES
    max_vpp: int = 4
    zero: tuple[int, ...] = (0, 1, 2, 3)
    overlap_grad_reduce: bool = True
    profile: str | None = None
    progress: bool = False
    # degree tuples the second pass refines fully (at least 2·top_k): the screen keeps every
    # tuple whose representative plan ranks in the first ``refine``; experiments/check_screen.py
    # compares the result against refining every tuple (RESULTS.md, "screening")
    refine: int = 12
    memory_margin_gib: float = DEFAULT_MARGIN_GIB   # HBM a plan must leave free (autoplan.cost.memory)
    kernels: str = "eager"                  # the engine's kernels (EstimateOptions.kernels)
    fsdp_grad_sync: str | None = None       # ZeRO-2/3 gradient reduction (EstimateOptions.fsdp_grad_sync)
    exact: bool = False                     # the reference path (EstimateOptions.exact)

    objective: str = DEFAULT_OBJECTIVE      # point | p50 | p90 | regret (search/robust.py)
    samples: int = DEFAULT_SAMPLES          # paired parameter samples per run; 0: no bands (point only)
    seed: int = DEFAULT_SEED
    params: Params = NOMINAL                # the model's parameter multipliers (a perturbation)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown objective '{self.objective}'", f"use one of {', '.join(OBJECTIVES)}")
        if self.samples < 0 or (self.samples == 0 and self.objective != "point"):
            raise UserError(f"objective {self.objective} needs parameter samples, got {self.samples}",
                            "pass --samples N with N ≥ 2, or --objective point")

    @property
    def worker_count(self) -> int:
        """Worker processes the search forks (``workers``; 0: one per CPU core)."""
        return self.workers or os.cpu_count() or 1

    @property
    def pool_size(self) -> int:
        """Meshes the robust objectives choose among: the best few by point step time."""
        return self.top_k if self.objective == "point" else max(3 * self.top_k, 12)

    def estimate_options(self) -> EstimateOptions:
        """The cost model's options under this search."""
        return EstimateOptions(overlap_grad_reduce=self.overlap_grad_reduce, allow_cross_domain=self.allow_cross_domain,
                               profile=self.profile, solver=self.solver, time_limit_s=self.time_limit_s,
                               memory_margin_gib=self.memory_margin_gib, kernels=self.kernels,
                               fsdp_grad_sync=self.fsdp_grad_sync, params=self.params, exact=self.exact)


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    estimate: Estimate
    layout: Layout | None = None             # the tp placements the block ILP chose (None: tp = 1)
    band: Band | None = None                 # step time over the run's paired samples
    robust: Robust | None = None             # the objective, P(best of the returned set), worst regret
    evidence: tuple[Flag, ...] = ()          # regimes it leans on that no published run covers

    def to_dict(self) -> dict:
        d = {"plan": self.plan.to_string(), "estimate": self.estimate.to_dict()}
        d["estimate"]["evidence"] = [f.to_dict() for f in self.evidence]
        if self.band is not None:
            d["estimate"].update(self.band.fields())
        if self.robust is not None:
            d["robust"] = self.robust.to_dict()
        if self.layout is not None:
            d["layout"] = self.layout.to_dict()
        return d


@dataclass(frozen=True)
class IlpRecord:
    block: str
    tp: int
    sp: bool
    size: dict
    solve_seconds: float
    gap: float
    status: str
    mbs: int = 1             # the local shape it was solved at
    cp: int = 1


@dataclass(frozen=True)
class SearchStats:
    space: SpaceStats
    pruned_memory: int
    pruned_bound: int
    meshes_evaluated: int
    plans_priced: int
    seconds: float
    ilps: tuple[IlpRecord, ...] = ()


@dataclass(frozen=True)
class SearchResult:
    candidates: tuple[Candidate, ...]
    stats: SearchStats
    max_ilp_gap: float = 0.0
    # with bands: every plan the objective chose among, with its band (pool order, no robust
    # record), so that another objective can be ranked over the same pool and samples; their
    # estimates are the search's (step, MFU, memory and fit as in full; no primitive table or
    # exposed P2P: ``stages.detailed`` prices those for the candidates)
    pool: tuple[Candidate, ...] = ()


def search(model: BlockGraph, cluster: Cluster, *, global_batch: int,
           options: SearchOptions = SearchOptions()) -> SearchResult:
    # forked workers inherit the pause, and the directory where they share the pipeline shapes
    # each builds (costmodels/pipeline/shared.py)
    with cyclic_gc_paused(), (sharing() if options.worker_count > 1 else nullcontext()):
        return _search(model, cluster, global_batch, options)


def _search(model: BlockGraph, cluster: Cluster, global_batch: int, options: SearchOptions) -> SearchResult:
    start = time.perf_counter()
    est = Estimator(model, cluster, options.estimate_options(), enforce_rules=True)
    meshes, space_stats = enumerate_meshes(model.model, model.num_layers, cluster, seq=model.sample_positions,
                                           global_batch=global_batch,
                                           allow_cross_domain=options.allow_cross_domain,
                                           zero_levels=options.zero)
    if not meshes:
        raise UserError(f"no mesh of {cluster.num_gpus} GPUs fits the rules for this model "
                        f"(heads {model.model.heads}, global batch {global_batch})",
                        "change --global-batch so that data parallelism can divide it")
    workers = options.worker_count
    _solve_ilps(est, meshes, global_batch, options.mbs, workers)
    bounded = []
    pruned_memory = 0
    least_states = float("inf")          # GiB: what the no-fit message reports where nothing was priced
    for mesh in meshes:
        states = states_floor(est, mesh, global_batch, options.mbs)
        least_states = min(least_states, states)
        if states > est.usable_bytes / GIB:
            pruned_memory += 1
            continue
        bounded.append((lower_bound(est, mesh, global_batch, options.mbs), _mesh_sort_key(mesh), mesh))
    bounded.sort(key=lambda t: (t[0], t[1]))
    global _WORKER_ESTIMATOR
    _WORKER_ESTIMATOR = est
    # one set of workers for the whole search: what a worker compiled while exploring (schedule
    # orders, periods, live walks, stage prices) it still holds when it hedges, details and bands
    procs = _pool(est, workers) if workers > 1 and (len(bounded) > workers or options.samples) else None
    try:
        results, evaluated, priced, pruned_bound, shortfall, variants = _explore(est, bounded, global_batch, options,
                                                                                 procs, start)
        if not results:
            raise UserError(_no_fit_message(est, shortfall, least_states), _no_fit_fix(est))
        ranked = sorted(results.values(), key=lambda r: (r.estimate.step_time_s, r.plan.to_string()))
        candidates, pool = _choose(est, ranked, variants, global_batch, options, procs)
    finally:
        if procs is not None:
            procs.close()
            procs.join()
    ilps = tuple(IlpRecord(k.graph, k.tp, k.sp, a.ilp_size, a.solve_seconds, a.gap, a.status, k.mbs, k.cp)
                 for k, a in sorted(est.layouts.assignments.items(),
                                    key=lambda kv: (kv[0].graph, kv[0].tp, kv[0].sp, str(kv[0].span), kv[0].mbs,
                                                    kv[0].cp)))
    stats = SearchStats(space_stats, pruned_memory, pruned_bound, evaluated, priced,
                        time.perf_counter() - start, ilps)
    return SearchResult(candidates, stats, max((i.gap for i in ilps), default=0.0), pool)


# --- pieces ------------------------------------------------------------------------------------

def _choose(est: Estimator, ranked: list[MeshResult], variants: dict[str, MeshResult], global_batch: int,
            options: SearchOptions, procs=None):
    """The top-K candidates: by point step time, or (bands on) by the objective over the pool
    (``pool.robust_pool``: the best meshes' searched variants and schedule hedges).  The hedges,
    the bands and the candidates' full estimates are priced in the search's workers ``procs``
    (None: here).  Returns (the candidates, the pool with its bands; empty without bands)."""
    moe = bool(est.info.experts)
    if options.samples == 0:
        return tuple(Candidate(r.plan, r.estimate, est.layout(r.plan), evidence=flags(r.plan, r.estimate, moe=moe))
                     for r in _detailed(est, ranked[:options.top_k], global_batch, procs)), ()
    hedges = None if procs is None else lambda plans, reach: procs.map(
        _hedge, [(plan, global_batch, options, reach) for plan in plans], chunksize=1)
    pool = ranked[:options.top_k] if options.objective == "point" else \
        robust_pool(est, ranked, variants, global_batch, options, hedges)
    # a band reads the point step and MFU, which the search's estimate has to the bit
    # (``stages.detailed``): only the plans picked are priced in full
    sampler = Sampler(est, options.samples, options.seed)
    bands = _bands(sampler, pool, global_batch, options.worker_count, procs)
    priced = tuple(Candidate(r.plan, r.estimate, band=band) for r, band in zip(pool, bands))
    ranks = rank_pool(priced, options.objective, options.top_k)
    full = _detailed(est, [pool[i] for i, _ in ranks], global_batch, procs)
    return tuple(Candidate(r.plan, r.estimate, est.layout(r.plan), priced[i].band, rob,
                           flags(r.plan, r.estimate, moe=moe)) for r, (i, rob) in zip(full, ranks)), priced


def _detailed(est: Estimator, results: list[MeshResult], global_batch: int, procs) -> list[MeshResult]:
    """``stages.detailed`` of every result, in the workers ``procs`` where given."""
    if procs is None or len(results) < 2:
        return [detailed(est, r, global_batch) for r in results]
    return procs.map(_detail, [(r, global_batch) for r in results], chunksize=1)


def rank_pool(pool: tuple[Candidate, ...], objective: str, top_k: int) -> list[tuple[int, Robust]]:
    """``robust.rank`` over banded candidates (a ``SearchResult.pool``): indices into ``pool``
    of the ``top_k`` kept, one per mesh (tp, cp, ep, pp, dp), each with its Robust record."""
    return robust.rank([c.plan.to_string() for c in pool], [c.band for c in pool], objective, top_k,
                       groups=[(c.plan.tp, c.plan.cp, c.plan.ep, c.plan.pp, c.plan.dp) for c in pool])


def _bands(sampler: Sampler, pool: list[MeshResult], global_batch: int, workers: int, procs=None) -> list[Band]:
    """``sampler.band`` of every pooled plan.  The samples are split over the worker processes
    ``procs`` (the search's, forked with ``sampler.base``; None: ``workers`` forked here), sample i
    in the i-th share of ``min(workers, samples)``, so that each share's estimators and caches live
    in one process; each worker draws the same samples (``Sampler`` of the same estimator, count
    and seed).  A sample's step does not depend on which plans it priced before, so the bands are
    the ones ``sampler.band`` gives one by one."""
    n = len(sampler.params)
    workers = min(workers, n)
    if workers < 2 or len(pool) < 2:
        return [sampler.band(r.plan, global_batch, r.estimate) for r in pool]
    own = procs is None
    if own:
        global _WORKER_ESTIMATOR
        _WORKER_ESTIMATOR = sampler.base
        procs = _pool(sampler.base, workers)
        if procs is None:
            return [sampler.band(r.plan, global_batch, r.estimate) for r in pool]
    plans = [r.plan for r in pool]
    shares = [range(w, n, workers) for w in range(workers)]
    try:
        parts = procs.map(_sample_steps, [(share, plans, global_batch, n, sampler.seed) for share in shares],
                          chunksize=1)
    finally:
        if own:
            procs.close()
            procs.join()
    steps = [[0.0] * n for _ in pool]
    for share, part in zip(shares, parts):
        for i, row in zip(share, part):
            for k, step in enumerate(row):
                steps[k][i] = step
    return [Band(tuple(steps[k]), r.estimate.step_time_s, r.estimate.mfu) for k, r in enumerate(pool)]


def _sample_steps(args) -> list[list[float]]:
    """Per sample of ``samples``: the step time of every plan on it (a worker of ``_bands``).  A
    worker serves one search (its pool is forked per search and the parent never sets the
    sampler), so the sampler made on its first share is the search's."""
    samples, plans, global_batch, n, seed = args
    global _WORKER_SAMPLER
    if _WORKER_SAMPLER is None:
        _WORKER_SAMPLER = Sampler(_WORKER_ESTIMATOR, n, seed)
    return _WORKER_SAMPLER.steps(plans, global_batch, samples)


def _mesh_sort_key(mesh: MeshChoice):
    return (mesh.tp, mesh.cp, mesh.ep, mesh.pp, mesh.dp, mesh.zero, not mesh.sp, mesh.cp_algo, mesh.order)


def _solve_ilps(est: Estimator, meshes: list[MeshChoice], global_batch: int, mbs_choices: tuple[int, ...],
                workers: int) -> None:
    """Solve every block ILP the meshes need before the search forks: one per (kind, tp, sp, tp
    span, cp, micro-batch), the keys ``cost.tp.BlockLayouts`` solves on; in worker processes when
    there are more ILPs than workers (CP-SAT with one worker and a deterministic time limit gives
    the same solution in any process)."""
    jobs: dict[LayoutKey, tuple[str, object]] = {}
    for mesh in meshes:
        for mbs in mbs_choices:
            if (global_batch // mesh.dp) % mbs == 0:
                plan = mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",))
                for key, kind in est.unsolved_layouts(plan):
                    jobs.setdefault(key, (kind, plan))
    # one task per (kind, tp, sp, span): its micro-batch and cp variants are solved in one process,
    # where those that meet on one problem share its solve (``sharding.solve.solve_problem``)
    groups: dict[tuple, list[tuple]] = {}
    for key in jobs:
        groups.setdefault((key.graph, key.tp, key.sp, key.span), []).append(key)
    tasks = [[jobs[key] for key in keys] for keys in groups.values()]
    global _WORKER_ESTIMATOR
    _WORKER_ESTIMATOR = est
    weights = [_task_weight(est, task) for task in tasks]
    if any(weights):
        load_backend(est.options.solver)     # once here, not once per forked worker
    pool = _pool(est, workers) if workers > 1 and len(tasks) > 1 and len(jobs) > workers else None
    # heaviest tasks first (a worker left with the heaviest one last idles the others), answers
    # put back in task order; each ILP's solution does not depend on the process that solves it
    order = sorted(range(len(tasks)), key=lambda i: (-weights[i], i))
    try:
        done = (pool.map(_solve_layout_jobs, [tasks[i] for i in order], chunksize=1) if pool is not None
                else [_solve_layout_jobs(tasks[i]) for i in order])
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    solved: list = [None] * len(tasks)
    for i, answer in zip(order, done):
        solved[i] = answer
    for keys, assignments in zip(groups.values(), solved):
        est.layouts.store(list(zip(keys, assignments)))


def _task_weight(est: Estimator, task: list[tuple[str, Plan]]) -> int:
    """How much solving ``task`` costs, roughly: the graph nodes of its ILPs (tp 1 has none)."""
    return sum(len(est.graph(kind).nodes) for kind, plan in task if plan.tp > 1)


def _solve_layout_jobs(jobs):
    return [_WORKER_ESTIMATOR.solve_layout(kind, plan) for kind, plan in jobs]


def lower_bound(est: Estimator, mesh: MeshChoice, global_batch: int, mbs_choices=(1, 2, 4, 8)) -> float:
    """A lower bound on the step time of any plan of ``mesh``: the smallest ``step_lower_bound``
    over the micro-batch sizes the search may pick."""
    return min((step_lower_bound(est, plan, global_batch) for plan in _mbs_plans(mesh, global_batch, mbs_choices)),
               default=float("inf"))


def states_floor(est: Estimator, mesh: MeshChoice, global_batch: int, mbs_choices=(1, 2, 4, 8)) -> float:
    """Model-state GiB per GPU no plan of ``mesh`` can avoid: the smallest ``states_lower_bound``
    over the micro-batch sizes the search may pick (0 when none runs: nothing to bound).  The
    states read the micro-batch size only through whether a step has one micro-batch."""
    plans = {plan.microbatches(global_batch) == 1: plan for plan in _mbs_plans(mesh, global_batch, mbs_choices)}
    return min((states_lower_bound(est, plan, global_batch) / GIB for plan in plans.values()), default=0.0)


def _mbs_plans(mesh: MeshChoice, global_batch: int, mbs_choices) -> list[Plan]:
    """The mesh's plan at each micro-batch size that divides its local batch (1F1B, no recompute)."""
    return [mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",)) for mbs in mbs_choices
            if (global_batch // mesh.dp) % mbs == 0]


def _explore(est: Estimator, bounded, global_batch: int, options: SearchOptions, pool=None,
             started: float | None = None):
    """Screen every degree tuple with a representative variant, then search the best tuples fully.

    Pass 1 (screen): for each (tp, cp, ep, pp, dp), one variant (ZeRO-1, SP on, ring CP, the
    first axis order; ZeRO-3 when that does not fit) over a representative few schedules.
    Pass 2 (refine, ``refine_tuple``): the best tuples get every variant and the full pipeline
    space.  Both passes go best-first by the admissible bound and prune against the K-th best
    distinct mesh so far.  With no more tuples than the refine budget, every tuple is refined.
    ``pool``: the search's worker processes (forked with ``est``; None: here)."""
    workers = options.worker_count
    tuples: dict[tuple, list] = {}
    for lb, sort_key, mesh in bounded:
        tuples.setdefault(mesh.key, []).append((lb, sort_key, mesh))
    refine_n = max(2 * options.top_k, options.refine)
    stats = {"evaluated": 0, "priced": 0, "pruned": 0, "shortfall": float("inf"), "variants": {}}
    results: dict[tuple, MeshResult] = {}
    progress = _progress(options.progress, len(tuples) + min(refine_n, len(tuples)), started)
    try:
        if len(tuples) > refine_n:
            reps = sorted(((_representative(v), v) for v in tuples.values()), key=lambda t: (t[0][0], t[0][1]))
            screened = _run(est, pool, workers, [(rep[0], rep[2].key, [rep] + [t for t in v if t is not rep])
                                                 for rep, v in reps],
                            global_batch, options, results, stats, progress, screen=True)
            chosen = sorted(tuples, key=lambda k: (screened[k].estimate.step_time_s if k in screened
                                                   else float("inf"), k))[:refine_n]
        else:
            chosen, screened = sorted(tuples), {}
        tasks = sorted(((min(t[0] for t in tuples[k]), k, sorted(tuples[k], key=lambda t: t[1])) for k in chosen),
                       key=lambda t: (t[0], t[1]))
        # after a screen the threshold is already tight: refine every chosen tuple in one batch,
        # so that no worker idles waiting for the slowest of a small batch
        _run(est, pool, len(tasks) if screened and pool else workers, tasks, global_batch, options, results, stats,
             progress, screen=False)
    finally:
        progress.stop()
    return results, stats["evaluated"], stats["priced"], stats["pruned"], stats["shortfall"], stats["variants"]


def _representative(variants):
    """The variant a tuple is screened with: ZeRO-1, SP on, ring, first order (else the closest)."""
    def rank(t):
        mesh = t[2]
        return (mesh.zero != 1, not mesh.sp, mesh.cp_algo != "ring", mesh.order != variants[0][2].order, t[1])
    return min(variants, key=rank)


def _run(est, pool, batch, tasks, global_batch, options, results, stats, progress, *, screen: bool):
    """Run (lb, tuple key, variants) tasks best-first, ``batch`` at a time (the K-th best so far,
    the pruning threshold, is updated between batches); returns the best result per tuple.

    In workers, a worker that finishes its task of a batch before the others starts the next
    batches ahead (``_look_ahead``) at the threshold the results so far give.  A task's result
    depends on its variants and threshold alone, and the true threshold, once the whole batch
    is in, is at most the one it ran at (the K-th best only falls): a run ahead is kept where
    each of its results is the one the true threshold gives (``MeshResult.same_below``), else
    the task runs again at the true threshold (``_Ahead``).  The batches, thresholds and results
    are the ones waiting for every batch gives."""
    best_here: dict[tuple, MeshResult] = {}
    ahead: dict[int, object] = {}     # task index -> its run started ahead
    i = 0
    while i < len(tasks):
        kth = _kth_best(results, options.top_k)
        chosen, i, pruned = _next_batch(tasks, i, batch, kth, results)
        stats["pruned"] += pruned
        for _ in range(pruned):
            progress.advance()
        if not chosen:
            continue
        args = {k: (variants, global_batch, options, kth, screen) for k, variants in chosen}
        if pool is None:
            outs = [_evaluate(args[k]) for k, _ in chosen]
        else:
            runs = [pool.apply_async(_evaluate, (args[k],)) if (hit := ahead.pop(k, None)) is None else
                    _Ahead(hit, kth, lambda a=args[k]: pool.apply_async(_evaluate, (a,))) for k, _ in chosen]
            for k in [k for k in ahead if k < i]:        # pruned at the true threshold
                del ahead[k]
            outs = _gather(runs, lambda done: _look_ahead(pool, tasks, i, batch, results, done, global_batch, options,
                                                          screen, ahead))
        for tuple_results in outs:
            progress.advance()
            _merge(tuple_results, results, best_here, stats)
    return best_here


SPECULATE = True      # False: wait for every batch before the next starts (the look-ahead's reference)
LOOK_AHEAD = 2        # batches started ahead (gpt-1t/h100x1024's screen: 2.2 s at 1, 2.1 s at 2 and 3)


def _next_batch(tasks, i: int, batch: int, kth: float, results) -> tuple[list[tuple[int, list]], int, int]:
    """From task ``i`` on, the next ``batch`` tasks a threshold of ``kth`` does not prune: ((task
    index, its meshes) each, the index after them, how many were pruned on the way).  A task is
    pruned where its bound reaches both the threshold and its tuple's best so far."""
    chosen, pruned = [], 0
    while i < len(tasks) and len(chosen) < batch:
        lb, key, variants = tasks[i]
        current = results.get(key)
        if lb >= kth and (current is None or lb >= current.estimate.step_time_s):
            pruned += 1
        else:
            chosen.append((i, [v[2] for v in variants]))
        i += 1
    return chosen, i, pruned


def _gather(runs, look_ahead) -> list:
    """The results of ``runs`` (async runs, in order); once the first is in while others still
    run, ``look_ahead(results so far)`` once."""
    outs: list = [None] * len(runs)
    looked = not SPECULATE or len(runs) < 2
    while True:
        for j, run in enumerate(runs):
            if outs[j] is None and run.ready():
                outs[j] = run.get()
        waiting = [j for j, o in enumerate(outs) if o is None]
        if not waiting:
            return outs
        if not looked and len(waiting) < len(runs):
            look_ahead([o for o in outs if o is not None])
            looked = True
        runs[waiting[0]].wait(0.002)


class _Ahead:
    """A task's run started ahead (``_look_ahead``), for ``_gather``: once it is in, kept where
    every result holds at ``threshold`` (``MeshResult.same_below``), else replaced by ``again()``,
    the task run at ``threshold``."""

    def __init__(self, run, threshold: float, again):
        self._run, self._threshold, self._again, self._checked = run, threshold, again, False

    def _check(self) -> None:
        if not self._checked and self._run.ready():
            self._checked = True
            if not all(r.same_below(self._threshold) for r in self._run.get()):
                self._run = self._again()

    def ready(self) -> bool:
        self._check()
        return self._checked and self._run.ready()

    def wait(self, timeout: float) -> None:
        self._check()
        self._run.wait(timeout)

    def get(self) -> list[MeshResult]:
        while not self.ready():
            self.wait(0.002)
        return self._run.get()


def _look_ahead(pool, tasks, i: int, batch: int, results, done: list, global_batch: int, options, screen: bool,
                ahead: dict) -> None:
    """Start the ``LOOK_AHEAD`` batches after task ``i`` at the threshold of ``results`` and the
    batch results ``done`` so far (``_run``), each run recorded in ``ahead`` (a task already there
    is not started again)."""
    merged = dict(results)
    for out in (out for tuple_results in done for out in tuple_results if out.plan is not None):
        _keep_best(out, merged)
    kth = _kth_best(merged, options.top_k)
    for _ in range(LOOK_AHEAD):
        chosen, i, _ = _next_batch(tasks, i, batch, kth, merged)
        for k, variants in chosen:
            if k not in ahead:
                ahead[k] = pool.apply_async(_evaluate, ((variants, global_batch, options, kth, screen),))


def _merge(tuple_results: list[MeshResult], results: dict, best_here: dict, stats: dict) -> None:
    """One task's results into the best per tuple (``results``, ``best_here``) and ``stats``."""
    for out in tuple_results:
        stats["evaluated"] += 1
        stats["priced"] += out.evaluated
        if out.plan is None:
            if out.pruned:
                stats["pruned"] += 1
            else:
                stats["shortfall"] = min(stats["shortfall"], out.shortfall_gib)
            continue
        stats["variants"][out.plan.to_string()] = out
        _keep_best(out, results, best_here)


def _keep_best(out: MeshResult, *tables: dict) -> None:
    """``out`` into each table of the best result per tuple, where it beats the one there."""
    for table in tables:
        prev = table.get(out.mesh.key)
        if prev is None or (out.estimate.step_time_s, out.plan.to_string()) < \
                (prev.estimate.step_time_s, prev.plan.to_string()):
            table[out.mesh.key] = out


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
                         max_vpp=options.max_vpp, threshold=threshold, screen=screen)

    if screen:
        # the representative, then — while memory binds — the next ZeRO stages of the same variant
        out = [run(variants[0])]
        for z in (2, 3):
            last = out[-1]
            if last.pruned or not (last.plan is None or last.memory_limited):
                break
            nxt = next((v for v in variants if v.zero == z and v.sp == last.mesh.sp
                        and v.cp_algo == last.mesh.cp_algo and v.order == last.mesh.order), None)
            if nxt is not None:
                out.append(run(nxt))
        return out
    out: list[MeshResult] = []
    orders = sorted({v.order for v in variants}, key=lambda o: [v.order for v in variants].index(o))
    base_order = orders[0]
    families = sorted({(v.sp, v.cp_algo) for v in variants}, key=lambda f: (not f[0], f[1]))
    for sp, algo in families:
        family = [v for v in variants if v.sp == sp and v.cp_algo == algo and v.order == base_order]
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
        best = min(fitting, key=lambda r: (r.estimate.step_time_s, r.plan.to_string()))
        for order in orders[1:]:
            plan = best.plan.replace(order=order)
            try:
                e = est.estimate(plan, global_batch, detail=False)     # in full where shown (``detailed``)
            except UserError:
                continue
            mesh = MeshChoice(best.mesh.tp, best.mesh.cp, best.mesh.ep, best.mesh.pp, best.mesh.dp,
                              best.mesh.zero, best.mesh.sp, best.mesh.cp_algo, order)
            out.append(MeshResult(mesh, plan, e, 0.0, 1) if e.fits else MeshResult(mesh, None, None, 0.0, 1))
    return out


def _kth_best(results: dict, k: int) -> float:
    if len(results) < k:
        return float("inf")
    return sorted(r.estimate.step_time_s for r in results.values())[k - 1]


_WORKER_ESTIMATOR: Estimator | None = None
_WORKER_SAMPLER: Sampler | None = None


def _evaluate(args) -> list[MeshResult]:
    variants, global_batch, options, threshold, screen = args
    return refine_tuple(_WORKER_ESTIMATOR, variants, global_batch, options, threshold, screen)


def _hedge(args) -> MeshResult | None:
    plan, global_batch, options, reach = args
    return hedge(_WORKER_ESTIMATOR, plan, global_batch, options, reach)


def _detail(args) -> MeshResult:
    result, global_batch = args
    return detailed(_WORKER_ESTIMATOR, result, global_batch)


def _pool(est: Estimator, workers: int):
    """Worker processes forked with the parent's estimator (ILP solutions included)."""
    try:
        ctx = mp.get_context("fork")
    except ValueError:
        return None
    return ctx.Pool(workers)


class _NoProgress:
    def advance(self) -> None:
        pass

    def stop(self) -> None:
        pass


class _RichProgress:
    """A progress bar on stderr that appears only once the search has run ``DELAY_S`` seconds
    since ``started`` (``time.perf_counter``; default now): a quick search prints nothing extra.
    It vanishes when done."""

    DELAY_S = 1.0

    def __init__(self, total: int, started: float | None = None):
        self._total, self._done, self._p = total, 0, None
        self._start, self._clock = time.perf_counter() if started is None else started, time.perf_counter

    def advance(self) -> None:
        self._done += 1
        if self._p is None and self._clock() - self._start >= self.DELAY_S:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("searching meshes"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._task = self._p.add_task("", total=self._total, completed=self._done - 1)
            self._p.start()
        if self._p is not None:
            self._p.advance(self._task)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()


def _progress(enabled: bool, total: int, started: float | None = None):
    return _RichProgress(total, started) if enabled else _NoProgress()


def _no_fit_message(est: Estimator, shortfall: float, least_states: float) -> str:
    """``shortfall``: the least GiB over HBM of a plan priced (inf: none was), else
    ``least_states``, the smallest model-state floor of any mesh (``states_floor``)."""
    hbm = est.usable_bytes / GIB
    if shortfall == float("inf"):
        shortfall = least_states - hbm
    return (f"{est.model.model.name} fits no plan on {est.cluster.name}: the closest plan needs "
            f"{shortfall:.1f} GiB more than the {hbm:.1f} GiB of HBM per GPU left by the "
            f"{est.options.memory_margin_gib:g} GiB memory margin")


def _no_fit_fix(est: Estimator) -> str:
    return ("use more GPUs (or GPUs with more memory), a shorter --seq or a smaller --global-batch; "
            "ZeRO-3, full recomputation and the largest pipeline were already tried")
