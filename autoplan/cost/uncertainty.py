"""Bands: a plan's step time and MFU over paired samples of the uncertain parameters.

``draw(ranges, n, seed)`` is a Latin hypercube over the parameter ranges of ``cost/params.py``:
each parameter's [low, high] is cut into n equal strata, one uniform point is drawn in each,
and the strata are shuffled per parameter by ``random.Random(seed)`` — so the same seed gives
the same samples, and every plan of a run is priced on the *same* samples (paired: the
difference of two plans on one sample is the difference under one consistent model).

``Sampler`` prices a plan once per sample with an ``Estimator`` whose options carry that
sample's ``Params``.  Every sample estimator shares the point estimator's block-ILP solutions
(a layout is part of the plan, not of the model) and one symbolic price of each layout
(``reprice.template``: which op and collective prices add up to each of its seconds), so what a
sample re-prices is only what the parameters reach — op and collective seconds, the exposed
overlaps and the pipeline makespan.  Each sample estimator keeps its own caches across plans.

Quantiles are linear interpolation between order statistics (numpy's default): q·(n−1).
MFU on a sample is the point MFU × point step / sample step (model FLOPs do not move).
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass

from autoplan.cost.estimator import Estimator
from autoplan.cost.params import Params, Range, ranges
from autoplan.cost.prices import AxisPricer, Prices, simulate_paired
from autoplan.cost.reprice import evaluate, template
from autoplan.cost.tp import LAYOUTS_KEPT, BlockLayouts, ShardingKey
from autoplan.cost.types import Estimate, EstimateOptions, SimulationArgs
from autoplan.errors import UserError
from autoplan.ir import OpGraph
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding
from costmodels.memo import Table

QUANTILES = (0.1, 0.5, 0.9)
DEFAULT_SAMPLES = 24        # paired parameter samples a run draws (0: no bands)
DEFAULT_SEED = 0


def draw(rs: tuple[Range, ...], n: int, seed: int) -> tuple[Params, ...]:
    """``n`` Latin-hypercube samples of the parameters in ``rs`` (module docstring)."""
    rng = random.Random(seed)
    columns = {}
    for r in rs:
        points = [r.low + (r.high - r.low) * (i + rng.random()) / n for i in range(n)]
        rng.shuffle(points)
        columns[r.name] = points
    return tuple(Params(**{name: col[i] for name, col in columns.items()}) for i in range(n))


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Band:
    """One plan's step time on every sample (paired across plans), and its MFU band."""

    step_s: tuple[float, ...]      # seconds, sample order
    point_step_s: float
    point_mfu: float

    def step(self, q: float) -> float:
        return quantile(self.step_s, q)

    def mfu(self, q: float) -> float:
        """MFU quantile: the step's (1−q) quantile turned into MFU."""
        return self.point_mfu * self.point_step_s / self.step(1.0 - q)

    def fields(self) -> dict[str, float]:
        """The JSON fields: step_time_s_p10/_p50/_p90, mfu_p10/_p50/_p90, band_samples."""
        out: dict[str, float] = {"band_samples": len(self.step_s)}
        for q in QUANTILES:
            tag = f"p{round(q * 100)}"
            out[f"step_time_s_{tag}"] = self.step(q)
            out[f"mfu_{tag}"] = self.mfu(q)
        return out


class Sampler:
    """Prices plans on the paired samples of one run (module docstring)."""

    def __init__(self, base: Estimator, samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED):
        if samples < 1:
            raise UserError(f"a band needs at least one parameter sample, got {samples}",
                            "pass --samples N with N ≥ 2 (or 0 where the command allows no band)")
        self.base = base
        self.seed = seed
        self.params = draw(ranges(base.cluster.gpu.name, base.options.profile), samples, seed)
        self._estimators: list[Estimator] | None = None
        self._templates: Table[BlockSharding] = Table("sampler.templates", LAYOUTS_KEPT)

    def estimators(self) -> list[Estimator]:
        if self._estimators is None:
            b = self.base
            self._estimators = []
            for p in self.params:
                e = Estimator(b.model, b.cluster, dataclasses.replace(b.options, params=p),
                              enforce_rules=b.layouts.enforce_rules)
                e.layouts = _SampleLayouts(e.prices, e.options, b.layouts, self._templates)
                self._estimators.append(e)
        return self._estimators

    def band(self, plan: Plan, global_batch: int, point: Estimate) -> Band:
        """``plan`` on every sample; ``point`` is its point estimate."""
        steps = self.steps([plan], global_batch, range(len(self.params)))
        return Band(tuple(row[0] for row in steps), point.step_time_s, point.mfu)

    def steps(self, plans: list[Plan], global_batch: int, samples: Iterable[int]) -> list[list[float]]:
        """Per sample index of ``samples``: the step time of every plan on it.  Each plan's
        pipelines on these samples (one shape, other stage times) are simulated at once first
        (``prices.simulate_paired``); each sample's ``step_time_s`` then finds its own."""
        estimators = [self.estimators()[i] for i in samples]
        if len(estimators) > 1:
            for plan in plans:
                simulate_paired([_simulation_request(e, plan, global_batch) for e in estimators])
        return [[e.step_time_s(p, global_batch) for p in plans] for e in estimators]


def _simulation_request(est: Estimator, plan: Plan, global_batch: int) -> tuple[Prices, SimulationArgs]:
    """(prices, arguments) of the one simulation ``est.step_time_s(plan, global_batch)`` runs."""
    est.check(plan, global_batch)
    args = est.simulation_args(plan, Mesh.of(plan), plan.microbatches(global_batch))
    return est.prices, args


class _SampleLayouts(BlockLayouts):
    """A sample's block layouts: the point estimator's ILP solutions, priced from shared templates."""

    def __init__(self, prices: Prices, options: EstimateOptions, point: BlockLayouts, templates: Table[BlockSharding]):
        super().__init__(prices, options, enforce_rules=point.enforce_rules)
        self.point = point
        self.templates = templates

    def sharding(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, mesh: Mesh) -> BlockSharding:
        key = ShardingKey(self.assignment_key(graph_key, plan, mesh), recompute)

        def symbolic() -> BlockSharding:
            self.point.sharding(graph_key, graph, plan, recompute, mesh)      # solves the ILP if need be
            point_key = self.point.assignment_key(graph_key, plan, mesh)
            assignment = self.point.assignments.get(point_key, lambda: self.point.solve(graph_key, graph, plan, mesh))
            return template(graph, assignment, self._context(plan, recompute, mesh, key.layout))
        return self._priced.get(key, lambda: evaluate(self.templates.get(key, symbolic), AxisPricer(self.prices, mesh)))
