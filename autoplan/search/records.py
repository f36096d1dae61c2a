"""The search's records: what it is asked (``SearchOptions``), what it returns (``SearchResult``
of ``Candidate``s, with ``SearchStats`` and an ``IlpRecord`` per block ILP solved), and what the
mesh search tallies on the way (``SearchCounters``, ``Explored``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from autoplan.cost import Estimate, EstimateOptions
from autoplan.cost.evidence import Flag
from autoplan.cost.uncertainty import DEFAULT_SAMPLES, DEFAULT_SEED, Band
from autoplan.errors import UserError
from autoplan.layout import Layout
from autoplan.plan import PRECISIONS, SCHEDULES, Plan
from autoplan.search.robust import DEFAULT_OBJECTIVE, OBJECTIVES, Objective, Robust
from autoplan.search.space import Constraints, MeshKey, SpaceStats
from autoplan.search.stages import MeshResult


@dataclass(frozen=True)
class SearchOptions:
    """What the search is asked: how the cost model prices (``estimate``, one place for each of
    its options, nested as torchtitan's ``JobConfig`` sections are) and how the search walks
    the plans."""

    estimate: EstimateOptions = EstimateOptions()   # the cost model's options for every plan priced
    top_k: int = 5
    workers: int = 0                        # 0: one per CPU core
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[str, ...] = SCHEDULES
    max_vpp: int = 4
    zero: tuple[int, ...] = (0, 1, 2, 3)
    # the linear GEMMs' precisions searched (Plan.precision; a plan dimension, the first screened
    # first): bf16 alone by default, so a search without --precision returns what it always did
    precisions: tuple[str, ...] = ("bf16",)
    progress: bool = False
    # degree tuples the second pass refines fully (at least 2·top_k): the screen keeps every
    # tuple whose representative plan ranks in the first ``refine``; experiments/check_screen.py
    # compares the result against refining every tuple (RESULTS.md, "screening")
    refine: int = 12
    objective: Objective = DEFAULT_OBJECTIVE   # point | p50 | p90 | regret (search/robust.py)
    samples: int = DEFAULT_SAMPLES          # paired parameter samples per run; 0: no bands (point only)
    seed: int = DEFAULT_SEED
    # the best plan under fixed knobs (degrees, CP algorithms, SP, recompute policies): ``space.Constraints``
    constraints: Constraints = Constraints()

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown objective '{self.objective}'", f"use one of {', '.join(OBJECTIVES)}")
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if unknown:
            raise UserError(f"unknown schedule '{unknown[0]}'", f"use schedules of: {', '.join(SCHEDULES)}")
        bad = [p for p in self.precisions if p not in PRECISIONS] or ([] if self.precisions else ["(none)"])
        if bad:
            raise UserError(f"unknown precision '{bad[0]}'", f"use precisions of: {', '.join(PRECISIONS)}")
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


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    estimate: Estimate
    layout: Layout | None = None             # the tp placements the block ILP chose (None: tp = 1)
    band: Band | None = None                 # step time over the run's paired samples
    robust: Robust | None = None             # the objective, P(best of the returned set), worst regret (pool)
    evidence: tuple[Flag, ...] = ()          # regimes it leans on that no published run covers

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"plan": self.plan.to_string(), "estimate": self.estimate.to_dict()}
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
    size: dict[str, int]
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
    # an MoE search under the NVLink rule: the best plan whose expert groups leave the NVLink
    # domain (cross-node EP), which the rule kept out (``driver._rule_breaking``); None when
    # none fits, the rule was lifted or the model has no experts
    rule_breaking: Candidate | None = None


@dataclass
class SearchCounters:
    """What the mesh search tallies as it merges its tasks' results (``SearchStats``' counts)."""

    evaluated: int = 0                       # mesh variants searched
    priced: int = 0                          # plans priced
    pruned: int = 0                          # tasks and variants their bound pruned
    shortfall_gib: float = float("inf")      # the least GiB over HBM of a plan priced (inf: none was)


@dataclass
class Explored:
    """The mesh search's findings, filled as its tasks come in: the best result per degree tuple
    (tp, cp, ep, pp, dp), every fitting variant's best result by plan string (what the robust
    pool chooses among), and the counts."""

    best: dict[MeshKey, MeshResult] = field(default_factory=dict)
    variants: dict[str, MeshResult] = field(default_factory=dict)
    counters: SearchCounters = field(default_factory=SearchCounters)
