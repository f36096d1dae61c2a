"""The memoised prices every per-parallelism pricer shares: op seconds, collective seconds, the pipeline simulator.

``Prices`` answers these questions for one cluster and compute profile, each memoised (a
``costmodels.memo.Table`` keyed on the question's arguments) because the search asks them many
thousands of times:

* ``op_seconds(kind, flops, bytes, gemm)``: one local op on one GPU (``costmodels.compute`` roofline;
  ``gemm_fp8`` against the GPU's FP8 peak, every other kind its bf16 peak);
* ``collective(kind, nbytes, ranks)``: one collective on a rank group (``costmodels.collectives``
  α–β model on the group's span of the hardware, ``topologies.Cluster.span``);
* ``slowest_hop(nbytes, ranks, closed)``: one step of a chain or ring of P2P sends (every rank
  sends to the next at once, so the step lasts as long as its slowest hop: a ring CP group of
  16 nodes crosses the network on every hop, not only past the NVLink domain of its first pair);
* ``simulate(args)``: the pipeline event simulator (``costmodels.pipeline``), extrapolating long
  steps unless ``exact`` (``EstimateOptions.exact``: every step event by event).

``AxisPricer`` binds a ``Prices`` to one plan's mesh: it is the ``sharding.Pricer`` the block
ILP prices with ("collective seconds on the tp axis").
"""
from __future__ import annotations

from collections.abc import Sequence

from autoplan.axes import Axis
from autoplan.cost.params import NOMINAL, Params, perturb_cluster, perturb_profile
from autoplan.cost.types import SimulationArgs, SimulationKey
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.sharding.types import Gemm
from costmodels import attention, compute
from costmodels.collectives import collective_time
from costmodels.memo import Table
from costmodels.pipeline import PipelineResult, simulate, simulate_many
from topologies.cluster import Cluster, GroupSpan

SIMULATION_CACHE_LIMIT = 20_000   # simulator results kept (a few MB); the table starts again empty past it
PRICES_KEPT = 200_000             # spans and collective seconds kept


class Prices:
    """The prices one cluster and compute profile give (module docstring): op and collective
    seconds, group spans and pipeline simulations, each memoised."""

    def __init__(self, cluster: Cluster, profile_path: str | None = None, params: Params = NOMINAL,
                 exact: bool = False, attention_kernel: str = "profile") -> None:
        """``params``: the uncertain parameters' multipliers, applied to the cluster and profile here
        and read by the pricers that own the mechanism ones (``cost/params.py``); ``exact``: the
        simulator's reference path; ``attention_kernel``: the flash-attention kernel whose published
        throughput replaces the profile's attention fractions (``costmodels.attention``), before
        ``params`` scale them."""
        self.cluster = perturb_cluster(cluster, params)
        self.params = params
        self.exact = exact
        try:
            profile = compute.load_profile(cluster.gpu.name, profile_path)
        except (ValueError, OSError) as e:
            raise UserError(str(e), "pass --profile PATH to a compute profile YAML") from None
        try:
            profile = attention.with_kernel(profile, attention_kernel, cluster.gpu.name)
        except ValueError as e:
            raise UserError(str(e), "use --attention-kernel profile (the compute profile's fitted fractions)") from None
        self.profile = perturb_profile(profile, params)
        self._spans: Table[GroupSpan] = Table("prices.spans", PRICES_KEPT)
        self._colls: Table[float] = Table("prices.collectives", PRICES_KEPT)
        self._sims: Table[PipelineResult] = Table("prices.simulations", SIMULATION_CACHE_LIMIT)

    def op_seconds(self, kind: str, flops: float, nbytes: float, gemm: Gemm | None) -> float:
        gpu = self.cluster.gpu
        peak = gpu.fp8_flops if kind == "gemm_fp8" and gpu.fp8_flops else gpu.bf16_flops
        return compute.op_time(kind, flops, nbytes, peak_flops=peak, hbm_bw=gpu.hbm_bw,
                               profile=self.profile, gemm=gemm)

    def span(self, ranks: Sequence[int]) -> GroupSpan:
        """The cluster's span of the group ``ranks`` (the levels it crosses)."""
        key = tuple(ranks)
        return self._spans.get(key, lambda: self.cluster.span(key))

    def collective(self, kind: str, nbytes: float, ranks: Sequence[int]) -> float:
        """Seconds of one collective on the group ``ranks``."""
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        return self._colls.get((kind, nbytes, tuple(ranks)),
                               lambda: collective_time(kind, nbytes, self.span(ranks), self.cluster))

    def slowest_hop(self, nbytes: float, ranks: Sequence[int], *, closed: bool) -> tuple[float, tuple[int, int]]:
        """(seconds, (sender, receiver)) of the slowest of the P2P hops ``ranks[i] → ranks[i+1]``,
        and ``ranks[-1] → ranks[0]`` when ``closed`` (a ring); the first such pair on ties."""
        ring = tuple(ranks)
        if len(ring) < 2:
            return 0.0, (ring[0], ring[0]) if ring else (0, 0)
        pairs = list(zip(ring, ring[1:])) + ([(ring[-1], ring[0])] if closed and len(ring) > 2 else [])
        return max(((self.collective("p2p", nbytes, pair), pair) for pair in pairs), key=lambda t: t[0])

    def simulate(self, args: SimulationArgs, p2p: float | None = None) -> PipelineResult:
        """The pipeline simulator on ``args`` (``p2p``: stage-to-stage seconds in place of the
        boundary's), memoised on its inputs (plans that differ only in ZeRO stage or data-parallel
        layout share their pipeline)."""
        key = args.key(p2p)
        return self._sims.get(key, lambda: simulate(
            args.schedule, stages=args.pp, microbatches=args.m, chunks=args.vpp, f=args.f, b=args.b, w=args.w,
            p2p=key[7], f_comm=args.f_comm, b_comm=args.b_comm, exact=self.exact))


def simulate_paired(requests: list[tuple[Prices, SimulationArgs]]) -> None:
    """Put into each ``Prices``' memo what its ``simulate(args)`` returns, for every (prices, args)
    of ``requests``: the requests of one shape (schedule, pp, m, vpp) — a band's samples of one
    plan — are simulated at once (``costmodels.pipeline.simulate_many``, equal to the bit), so
    a later ``simulate`` with those arguments finds its result."""
    shapes: dict[tuple[str, int, int, int, bool], list[tuple[Prices, SimulationKey, SimulationArgs]]] = {}
    for prices, args in requests:
        key = args.key()
        if key not in prices._sims:
            shapes.setdefault((args.schedule, args.pp, args.m, args.vpp, prices.exact), []).append((prices, key, args))
    for (schedule, pp, m, vpp, exact), todo in shapes.items():
        runs = [dict(f=a.f, b=a.b, w=a.w, p2p=a.p2p, f_comm=a.f_comm, b_comm=a.b_comm) for _, _, a in todo]
        for (prices, key, _), result in zip(todo, simulate_many(schedule, stages=pp, microbatches=m, chunks=vpp,
                                                                runs=runs, exact=exact)):
            prices._sims.put(key, result)


class AxisPricer:
    """``sharding.Pricer`` on one mesh: collectives on the group of a named axis holding rank 0."""

    def __init__(self, prices: Prices, mesh: Mesh) -> None:
        self._prices = prices
        self._mesh = mesh

    def op_seconds(self, kind: str, flops: float, nbytes: float, gemm: Gemm | None) -> float:
        return self._prices.op_seconds(kind, flops, nbytes, gemm)

    def collective_seconds(self, kind: str, nbytes: float, axis: Axis) -> float:
        return self._prices.collective(kind, nbytes, self._mesh.group(Axis(axis).value))
