"""From the mesh search's best plan per mesh to the candidates it returns.

    choose(est, executor, ranked, variants, global_batch, options) -> Chosen

Without bands (``samples`` = 0), the ``top_k`` fastest meshes by point step time.  With bands,
the robust pool (``pool.robust_pool``: the best meshes' searched variants and schedule hedges)
is priced on the run's paired parameter samples and ranked by the objective (``robust``).  The
hedges, the bands and the candidates' full estimates (``stages.detailed``) run on the search's
executor.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from autoplan.cost import Estimate, Estimator
from autoplan.cost.evidence import flags
from autoplan.cost.uncertainty import Band, Sampler
from autoplan.plan import Plan
from autoplan.search import robust
from autoplan.search.executor import Executor, Worker
from autoplan.search.pool import hedge, robust_pool
from autoplan.search.records import Candidate, SearchOptions
from autoplan.search.robust import Robust
from autoplan.search.stages import MeshResult, detailed


class Priced(Protocol):
    """A plan with its estimate, as ``_bands`` reads it (a ``MeshResult`` that found one, a ``Candidate``)."""

    @property
    def plan(self) -> Plan | None: ...

    @property
    def estimate(self) -> Estimate | None: ...


def _found(r: Priced) -> tuple[Plan, Estimate]:
    if r.plan is None or r.estimate is None:
        raise ValueError("only a found plan is priced on the samples")
    return r.plan, r.estimate


@dataclass(frozen=True)
class Chosen:
    candidates: tuple[Candidate, ...]
    pool: tuple[Candidate, ...]          # with bands: every plan ranked, with its band; else empty


def choose(est: Estimator, executor: Executor, ranked: list[MeshResult], variants: dict[str, MeshResult],
           global_batch: int, options: SearchOptions) -> Chosen:
    """The top-K candidates of ``ranked`` (the best result per mesh, fastest first); ``variants``:
    every variant's best result by plan string (what the robust pool chooses among)."""
    detail = partial(_detail, global_batch=global_batch)
    if options.samples == 0:
        return Chosen(tuple(_candidate(est, r) for r in executor.map(detail, ranked[:options.top_k])), ())
    pool = ranked[:options.top_k] if options.objective == "point" else robust_pool(
        est, ranked, variants, global_batch, options,
        lambda plans, reach: executor.map(partial(_hedge, global_batch=global_batch, options=options, reach=reach),
                                          plans))
    # a band reads the point step and MFU, which the search's estimate has to the bit
    # (``stages.detailed``): only the plans picked are priced in full
    bands = _bands(executor, Sampler(est, options.samples, options.seed), pool, global_batch)
    priced = tuple(Candidate(r.found_plan, r.found_estimate, band=band) for r, band in zip(pool, bands))
    ranks = rank_pool(priced, options.objective, options.top_k)
    full = executor.map(detail, [pool[i] for i, _ in ranks])
    return Chosen(tuple(_candidate(est, r, priced[i].band, rob) for r, (i, rob) in zip(full, ranks)), priced)


def _candidate(est: Estimator, r: MeshResult, band: Band | None = None, rob: Robust | None = None) -> Candidate:
    """A returned plan: its full estimate, tp layout, band, robust record and evidence flags."""
    plan, estimate = r.found_plan, r.found_estimate
    return Candidate(plan, estimate, est.layout(plan), band, rob, flags(plan, estimate, moe=bool(est.info.experts)))


def rank_pool(pool: tuple[Candidate, ...], objective: str, top_k: int) -> list[tuple[int, Robust]]:
    """``robust.rank`` over banded candidates (a ``SearchResult.pool``): indices into ``pool``
    of the ``top_k`` kept, one per mesh (tp, cp, ep, pp, dp), each with its Robust record."""
    return robust.rank([c.plan.to_string() for c in pool], [_band(c) for c in pool], objective, top_k,
                       groups=[(c.plan.tp, c.plan.cp, c.plan.ep, c.plan.pp, c.plan.dp) for c in pool])


def _band(c: Candidate) -> Band:
    if c.band is None:
        raise ValueError(f"{c.plan.to_string()} has no band: only banded candidates are ranked")
    return c.band


def _bands(executor: Executor, sampler: Sampler, pool: Sequence[Priced], global_batch: int) -> list[Band]:
    """``sampler.band`` of every pooled plan.  In workers the samples are split, sample i in the
    i-th share of ``min(workers, samples)``, each share one task, so that its estimators and
    caches live in one process (``Worker.sampler``: the same samples as ``sampler``).  A sample's
    step does not depend on which plans it priced before: the bands are the ones one by one."""
    n = len(sampler.params)
    workers = min(executor.workers, n)
    found = [_found(r) for r in pool]
    if workers < 2 or len(pool) < 2:
        return [sampler.band(plan, global_batch, e) for plan, e in found]
    shares = [range(w, n, workers) for w in range(workers)]
    parts = executor.map(partial(_sample_steps, plans=[plan for plan, _ in found], global_batch=global_batch,
                                 samples=n, seed=sampler.seed), shares)
    steps = [[0.0] * n for _ in pool]
    for share, part in zip(shares, parts):
        for i, row in zip(share, part):
            for k, step in enumerate(row):
                steps[k][i] = step
    return [Band(tuple(steps[k]), e.step_time_s, e.mfu) for k, (_, e) in enumerate(found)]


def _sample_steps(worker: Worker, share: range, *, plans: list[Plan], global_batch: int, samples: int,
                  seed: int) -> list[list[float]]:
    """Per sample of ``share``: the step time of every plan on it."""
    return worker.sampler(samples, seed).steps(plans, global_batch, share)


def _hedge(worker: Worker, plan: Plan, *, global_batch: int, options: SearchOptions,
           reach: float) -> MeshResult | None:
    return hedge(worker.est, plan, global_batch, options, reach)


def _detail(worker: Worker, result: MeshResult, *, global_batch: int) -> MeshResult:
    return detailed(worker.est, result, global_batch)
