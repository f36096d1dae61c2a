"""The search's records: what it is asked (``SearchOptions``), what it returns (``SearchResult``
of ``Candidate``s, with ``SearchStats`` and an ``IlpRecord`` per block ILP solved), and what the
mesh search tallies on the way (``SearchCounters``, ``Explored``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from autoplan.cost import Estimate, EstimateOptions
from autoplan.cost.evidence import Flag
from autoplan.cost.params import NOMINAL, Params
from autoplan.cost.types import DEFAULT_MARGIN_GIB
from autoplan.cost.uncertainty import DEFAULT_SAMPLES, DEFAULT_SEED, Band
from autoplan.errors import UserError
from autoplan.layout import Layout
from autoplan.plan import SCHEDULES, Plan
from autoplan.search.robust import DEFAULT_OBJECTIVE, OBJECTIVES, Robust
from autoplan.search.space import SpaceStats
from autoplan.search.stages import MeshResult


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

    objective: str = DEFAULT_OBJECTIVE      # point | p50 | p90 | regret (search/robust.py)
    samples: int = DEFAULT_SAMPLES          # paired parameter samples per run; 0: no bands (point only)
    seed: int = DEFAULT_SEED
    params: Params = NOMINAL                # the model's parameter multipliers (a perturbation)

    def __post_init__(self) -> None:
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
                               fsdp_grad_sync=self.fsdp_grad_sync, params=self.params)


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

    best: dict[tuple, MeshResult] = field(default_factory=dict)
    variants: dict[str, MeshResult] = field(default_factory=dict)
    counters: SearchCounters = field(default_factory=SearchCounters)
