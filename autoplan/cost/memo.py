"""Every cache an ``Estimator`` keeps across plans, and the typed keys they are keyed on.

A table's key holds every input its value reads that the Estimator does not fix (the model, the
cluster and ``EstimateOptions`` are fixed per Estimator: so is every field of the pricers'
``context.PlanContext`` but the plan and its mesh).  Where a value reads part of a plan,
that part is a record of its own, projected from the plan by one function (``LocalShape.of``,
``BagKey.of``, ``ShapeKey.of``) and hashed whole: no key lists plan fields in a bare tuple, none
is built from ``id()``.  The keys are named tuples, hashed and compared in C as fast as the
tuples they replace (frozen dataclass keys, hashed and compared in Python, cost a few µs more
per lookup: 5 % more CPU for a search).
``tests/autoplan/cost/test_memo_keys.py`` changes every Plan field and workload input in turn
under ``costmodels.memo.audit()``: a projection that misses an input its value reads gives a
stale hit, and the test fails.

==================  ==========  ============================================  =====================
table               key         value                                         read by
==================  ==========  ============================================  =====================
parts               PartKey     one graph's ``Part`` (``parts.price_part``)   ``Estimator.part``
bags                BagKey      ``pp.stage_bags``                             ``Estimator.stage_bags``
pipelines           PlanAt      ``pp.simulation_args`` at m micro-batches     ``Estimator.simulation_args``
shapes              ShapeKey    what a floor reads besides the ZeRO stage     ``bounds``
makespan_floors     ShapeKey    its makespan bound and embedding sync         ``bounds.plan_floor``
estimates           PlanAt      ``Estimator.estimate(detail=False)``          ``search.stages``
steps               PlanAt      ``Estimator.step_time_s``                     ``search.stages``
memories, floors    PlanAt      ``bounds.plan_memory``, ``plan_floor``        ``search.stages``
==================  ==========  ============================================  =====================

(``PlanAt`` keys the last four on the global batch, ``pipelines`` on the micro-batches.)  The
prices every pricer shares live on ``Prices`` (collective seconds by (kind, bytes, ranks), spans,
simulations by their arguments) and the block ILP's solutions on ``tp.BlockLayouts``
(``LayoutKey``), each a ``costmodels.memo.Table`` too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from autoplan.axes import EXPERT_TP, Axis
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import SCHEDULE_SPECS, Plan
from costmodels.memo import Table

if TYPE_CHECKING:
    from autoplan.cost.pp import Bag
    from autoplan.cost.types import Part, SimulationArgs

_TP, _CP, _EP = Axis.TP.value, Axis.CP.value, Axis.EP.value      # read once: an enum's value is a property
KEPT = 20_000              # entries per Estimator table; a table past it starts again empty
SEARCH_KEPT = 50_000       # the search's estimates, floors and memories: one per plan it asks about


class LocalShape(NamedTuple):
    """What pricing one graph reads of a plan and its mesh: the per-GPU shape (tp, sequence
    parallelism, cp, its algorithm and split, ep, micro-batch), the GEMMs' precision, rank 0's
    tp, cp and ep groups, which its collectives run on, the MoE folding (``etp``, None
    unfolded), the MoE dispatcher and rank 0's expert-tensor-parallel group (``cost.ep``).  Plans
    differing elsewhere (pp, dp, ZeRO, schedule, cuts, ``ep_overlap``) share it."""

    tp: int
    sp: bool
    cp: int
    cp_algo: str
    ulysses: int                # the plan's USP split (0: the rule's)
    ep: int
    mbs: int
    tp_ranks: tuple[int, ...]
    cp_ranks: tuple[int, ...]
    ep_ranks: tuple[int, ...]
    precision: str
    etp: int | None
    dispatcher: str
    etp_ranks: tuple[int, ...]

    @staticmethod
    def of(plan: Plan, mesh: Mesh) -> LocalShape:
        return LocalShape(plan.tp, bool(plan.sp), plan.cp, plan.cp_algo, plan.ulysses, plan.ep, plan.mbs,
                          mesh.group(_TP), mesh.group(_CP), mesh.group(_EP), plan.precision, plan.etp,
                          plan.dispatcher, mesh.group(EXPERT_TP))


class PartKey(NamedTuple):
    """One graph (a block kind, "@pre" or "@post") under a recompute policy at a local shape."""

    graph: str
    recompute: str
    local: LocalShape


class BagKey(NamedTuple):
    """What ``pp.stage_bags`` reads: the parts' local shape, the virtual stages and their layers,
    the placement of stages on ranks and each stage's recompute policy."""

    local: LocalShape
    pp: int
    vpp: int
    layers: tuple[int, ...]
    placement: str
    recompute: tuple[str, ...]

    @staticmethod
    def of(plan: Plan, mesh: Mesh, num_layers: int) -> BagKey:
        return BagKey(LocalShape.of(plan, mesh), plan.pp, plan.vpp, plan.stage_layers(num_layers),
                      SCHEDULE_SPECS[plan.schedule].placement, plan.recompute)


class ShapeKey(NamedTuple):
    """What a plan's memory and step floor read that its ZeRO stage does not change
    (``bounds._Shape``): its stage bags, its mesh (the bags' degrees with dp and the axis order:
    the data-parallel groups, the boundary's hop), its schedule (order, live walk, makespan
    bound), its micro-batches and whether combined 1F1B hides its EP transfers (``ep_overlap``:
    the stage times the makespan bound reads)."""

    bags: BagKey
    dp: int
    order: tuple[str, ...]
    schedule: str
    microbatches: int
    ep_overlap: bool = False

    @staticmethod
    def of(plan: Plan, mesh: Mesh, microbatches: int, num_layers: int) -> ShapeKey:
        return ShapeKey(BagKey.of(plan, mesh, num_layers), plan.dp, plan.order, plan.schedule, microbatches,
                        plan.ep_overlap)


class PlanAt(NamedTuple):
    """A whole plan at a global batch (the search's memos) or at a micro-batch count (its pipeline)."""

    plan: Plan
    at: int


class EstimatorMemo:
    """The tables of one Estimator (module docstring); ``clear()`` empties them all."""

    def __init__(self) -> None:
        self.parts: Table[Part] = Table("estimator.parts", KEPT)
        self.bags: Table[list[Bag]] = Table("estimator.bags", KEPT)
        self.pipelines: Table[SimulationArgs] = Table("estimator.pipelines", KEPT)
        self.shapes: Table[Any] = Table("bounds.shapes", KEPT)
        self.makespan_floors: Table[Any] = Table("bounds.makespan_floors", KEPT)
        self.estimates: Table[Any] = Table("search.estimates", SEARCH_KEPT, errors=(UserError,))
        self.steps: Table[Any] = Table("search.steps", SEARCH_KEPT, errors=(UserError,))
        self.memories: Table[Any] = Table("search.memories", SEARCH_KEPT, errors=(UserError,))
        self.floors: Table[Any] = Table("search.floors", SEARCH_KEPT, errors=(UserError,))

    def tables(self) -> tuple[Table[Any], ...]:
        return tuple(t for t in vars(self).values() if isinstance(t, Table))

    def clear(self) -> None:
        for table in self.tables():
            table.clear()
