"""Pipeline parallelism: layers to virtual stages, stage times, stage-to-stage P2P, the schedule's makespan.

Each virtual stage (chunk) is a *bag* of (per-micro-batch part, how many layers of it): its
layers by block kind, plus the embedding (``@pre``) on the first chunk and the head and loss
(``@post``) on the last.  Its forward time F = Σ (forward + exposed forward communication),
B = Σ (input-gradient + exposed backward communication), W = Σ weight-gradient.  These go to
the event simulator of ``costmodels.pipeline`` with the P2P time of one boundary activation on
the slowest stage-to-stage hop (the last rank back to the first too, under interleaving),
``b·(s/cp)·h·e / tp`` bytes per tp rank (e: the residual stream's element size as traced, 2 in
bf16: ``PlanContext.activation_bytes``; sequence-sharded under SP, split over tp and
all-gathered on the receiver without it, as Megatron and DeepSpeed send it).  DualPipeV overlaps one
micro-batch's EP all-to-all with the other's compute (DeepSeek-V3 §3.2.1), so the EP part of
each stage's time is passed to the simulator separately; TP/CP collectives stay on each
layer's critical path.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplan.axes import Axis
from autoplan.cost.context import PlanContext
from autoplan.cost.ep import hide_paired, paired_fraction
from autoplan.cost.prices import Prices
from autoplan.cost.types import Boundary, Part, SimulationArgs
from autoplan.plan import Plan, partial_recompute
from costmodels.memo import memo
from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS
from costmodels.pipeline import PipelineResult

Bag = list[tuple[Part, int]]
NO_BOUNDARY = Boundary(0.0, 0.0, (), 0.0)     # a single stage sends nothing


@dataclass(frozen=True)
class Pipeline:
    """The priced pipeline of one plan."""

    bags: tuple[Bag, ...]                 # per virtual stage, model order
    rank_chunks: tuple[tuple[int, ...], ...]   # virtual stages of each pipeline rank
    f: tuple[float, ...]
    b: tuple[float, ...]
    w: tuple[float, ...]
    act_bytes: float                      # one boundary activation, bytes
    p2p_s: float                          # one stage-to-stage send, seconds
    sim: PipelineResult                   # costmodels.pipeline simulation result
    p2p_exposed_s: float                  # what P2P adds to the makespan (0 unless detail)
    p2p_hop: tuple[int, ...] = ()         # the (sender, receiver) of the slowest stage-to-stage hop
    gather_s: float = 0.0                 # part of p2p_s: the receiver's all-gather over tp (no SP)
    post_validation: bool = False         # EstimateOptions.post_validation: steps overlap across ranks
    engine_host_s: tuple[float, ...] = ()  # per virtual stage, the engine's host seconds in each F and B

    def engine_host_seconds(self, rank: int, microbatches: int) -> float:
        """The pipeline engine's host seconds on ``rank`` over a step: each of its virtual
        stages' F and B carry ``engine_host_s`` once per micro-batch (``engine_instructions``)."""
        if not self.engine_host_s:
            return 0.0
        return 2 * microbatches * sum(self.engine_host_s[c] for c in self.rank_chunks[rank])

    @property
    def step_s(self) -> float:
        """What the pipeline adds to a step: the makespan, or under optimizer post-validation the
        steady step (each rank starts the next step when it ends this one; equal to the makespan
        wherever rank 0 starts first and ends last: GPipe, 1F1B, interleaved)."""
        return self.sim.steady_step_time if self.post_validation else self.sim.step_time


def bubble_fraction(pipe: Pipeline) -> float:
    """The idle share of the ranks' time over the step the pipeline adds (``Pipeline.step_s``)."""
    return pipe.sim.steady_bubble_fraction if pipe.post_validation else pipe.sim.bubble_fraction


def layer_policies(policy: str, n: int) -> list[str]:
    """The recompute policy of each of a virtual stage's ``n`` layers: ``full:N`` fully
    recomputes the first N (Megatron ``--recompute-method block``), ``op:N`` op-checkpoints
    them, the rest keep everything."""
    part = partial_recompute(policy)
    if part is None:
        return [policy] * n
    head, k = part
    return [head] * min(k, n) + ["none"] * max(n - k, 0)


def stage_bags(plan: Plan, order: tuple[str, ...], num_layers: int, part: Callable[[str, str], Part]) -> list[Bag]:
    """Each virtual stage as a bag of (part, layers of it); ``part(kind, recompute)``, asked
    once per (kind, recompute) of the plan."""
    chunks = plan.pp * plan.vpp
    parts: dict[tuple[str, str], Part] = {}

    def get(kind: str, rc: str) -> Part:
        hit = parts.get((kind, rc))
        if hit is None:
            hit = parts[(kind, rc)] = part(kind, rc)
        return hit

    bags: list[Bag] = []
    start = 0
    layers = plan.stage_layers(num_layers)
    # inner chunks of the same layers and policy share one bag
    alike: dict[tuple[tuple[tuple[str, int], ...], str], Bag] = {}
    for c, (n, kinds) in enumerate(zip(layers, _chunk_kinds(order, layers))):
        rc = plan.recompute_of_stage(plan.stage_rank(c))
        if partial_recompute(rc) is None:
            inner = 0 < c < chunks - 1            # the end chunks get @pre/@post appended: their own list
            bag = alike.get((kinds, rc)) if inner else None
            if bag is None:
                bag = [(get(k, rc), count) for k, count in kinds]
                if inner:
                    alike[(kinds, rc)] = bag
        else:         # full:N, op:N: the policy depends on the layer's place in its stage
            counted = Counter(zip(order[start:start + n], layer_policies(rc, n)))
            bag = [(get(k, policy), count) for (k, policy), count in counted.items()]
        start += n
        if c == 0:
            bag.append((get("@pre", "none"), 1))
        if c == chunks - 1:
            bag.append((get("@post", "none"), 1))
        bags.append(bag)
    return bags


@memo(4096)
def _chunk_kinds(order: tuple[str, ...], layers: tuple[int, ...]) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Per virtual stage, (block kind, layers of it) in first-seen order."""
    out: list[tuple[tuple[str, int], ...]] = []
    start = 0
    for n in layers:
        out.append(tuple(Counter(order[start:start + n]).items()))
        start += n
    return tuple(out)


def per_bag(bags: Sequence[Bag], fn: Callable[[Bag], tuple[float, ...]]) -> list[list[float]]:
    """``fn(bag)`` (a tuple of sums) of every bag, as one list per entry of the tuple; ``fn`` once
    per run of one shared list (``stage_bags`` gives the inner virtual stages of the same layers
    and policy one list, and those stages follow each other)."""
    rows: list[tuple[float, ...]] = []
    before: Bag | None = None
    for bag in bags:
        rows.append(rows[-1] if bag is before else fn(bag))
        before = bag
    return [list(column) for column in zip(*rows)] if rows else []


def stage_times(bags: Sequence[Bag], wpass: float = 1.0) -> tuple[list[float], list[float], list[float]]:
    """Per virtual stage F (forward + exposed forward communication), B (input gradient +
    exposed backward communication) and W (weight gradient, × ``wpass``), seconds per micro-batch."""
    f, b, w = per_bag(bags, lambda bag: (sum((p.forward_s + p.exposed_fwd_s) * n for p, n in bag),
                                         sum((p.backward_s + p.exposed_bwd_s) * n for p, n in bag),
                                         sum(p.wgrad_s * n for p, n in bag) * wpass))
    return f, b, w


def engine_host(n: int, host_s: float) -> list[float]:
    """Per virtual stage of ``n``, the pipeline engine's host seconds in each F and each B
    (``ComputeProfile.p2p_host_s`` per send or receive instruction).  DeepSpeed's PipelineEngine
    runs each micro-batch as instructions (RecvActivation, ForwardPass, SendActivation; RecvGrad,
    BackwardPass, SendGrad), each send or receive costing the stage's host ``host_s`` of Python
    and bookkeeping (buffers, tensor meta, partitioned activations, the c10d call) on the
    critical path of a host-bound stage: a stage with k boundaries (1 at the ends, 2 inside)
    adds k · host_s to its F and to its B, once per micro-batch."""
    if host_s <= 0.0 or n < 2:
        return [0.0] * n
    return [((c > 0) + (c < n - 1)) * host_s for c in range(n)]


def engine_instructions(f: list[float], b: list[float], host_s: float) -> tuple[list[float], list[float]]:
    """F and B per virtual stage with the pipeline engine's host seconds (``engine_host``).
    Lower bounds (``cost.bounds``) leave it out and stay bounds."""
    h = engine_host(len(f), host_s)
    return [x + hc for x, hc in zip(f, h)], [x + hc for x, hc in zip(b, h)]


def engine_host_s(prices: Prices, bags: Sequence[Bag]) -> float:
    """The pipeline engine's host seconds per send or receive instruction: the profile's
    ``p2p_host_s``, or for a model with experts (a part holding expert parameters) at least its
    ``moe_p2p_host_s``: every MoE layer synchronizes the host with the GPU, so the host no longer
    runs ahead of the schedule and its per-instruction work shows (``costmodels.compute``)."""
    profile = prices.profile
    moe = profile.moe_p2p_host_s > 0.0 and any(p.expert_numel for bag in bags for p, _ in bag)
    return max(profile.p2p_host_s, profile.moe_p2p_host_s) if moe else profile.p2p_host_s


def wpass_factor(prices: Prices, schedule: str) -> float:
    """The uncertain cost multiplier of a split W pass (zero-bubble schedules; 1 at the point)."""
    return prices.params.wpass if SCHEDULE_SPECS[schedule].split_backward else 1.0


def rank_chunks(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """The virtual stages of each pipeline rank."""
    return tuple(plan.stages_of_rank(r) for r in range(plan.pp))


def simulation_args(ctx: PlanContext, bags: list[Bag], m: int) -> SimulationArgs:
    """What ``price_pipeline`` simulates for ``ctx.plan``, its virtual stages ``bags``, at ``m``
    micro-batches (a band asks for every sample's before simulating them at once)."""
    plan, prices = ctx.plan, ctx.prices
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    f, b, w = overlapped_stage_times(plan, bags, wpass_factor(prices, schedule), m)
    f, b = engine_instructions(f, b, engine_host_s(prices, bags))
    f_comm, b_comm = pair_comms(schedule, bags)
    return SimulationArgs(schedule, plan.pp, m, plan.vpp, f, b, w, f_comm, b_comm, boundary(ctx))


def overlapped_stage_times(plan: Plan, bags: Sequence[Bag], wpass: float, m: int
                           ) -> tuple[list[float], list[float], list[float]]:
    """``stage_times``, with the EP transfers combined 1F1B hides taken off (``plan.ep_overlap``:
    ``ep.hide_paired`` at the schedule's ``ep.paired_fraction`` of ``m`` micro-batches)."""
    f, b, w = stage_times(bags, wpass)
    if not plan.ep_overlap:
        return f, b, w
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    f_comm, b_comm = per_bag(bags, lambda bag: (sum(p.ep_fwd_s * n for p, n in bag),
                                                sum(p.ep_bwd_s * n for p, n in bag)))
    f, b = hide_paired(f, b, f_comm, b_comm, paired_fraction(schedule, plan.pp, plan.vpp, m))
    return f, b, w


def price_pipeline(ctx: PlanContext, bags: list[Bag], args: SimulationArgs, *, detail: bool) -> Pipeline:
    """The priced pipeline of ``ctx.plan`` from its ``simulation_args`` ``args``; with ``detail``,
    also the exposed share of stage-to-stage P2P (a second simulation, without it); under
    ``EstimateOptions.post_validation``, ``Pipeline.step_s`` is the steady step."""
    plan, post_validation = ctx.plan, ctx.options.post_validation
    sim = ctx.prices.simulate(args)
    p2p_exposed = 0.0
    if plan.pp > 1 and detail:
        no_p2p = ctx.prices.simulate(args, p2p=0.0)
        if post_validation:
            p2p_exposed = max(0.0, sim.steady_step_time - no_p2p.steady_step_time)
        else:
            p2p_exposed = max(0.0, sim.step_time - no_p2p.step_time)
    bnd = args.boundary
    host = tuple(engine_host(len(args.f), engine_host_s(ctx.prices, bags)))
    return Pipeline(tuple(bags), rank_chunks(plan), tuple(args.f), tuple(args.b), tuple(args.w), bnd.bytes_per_rank,
                    bnd.seconds, sim, p2p_exposed, bnd.hop, bnd.gather_s, post_validation, host)


def pair_comms(schedule: str, bags: Sequence[Bag]) -> tuple[list[float] | None, list[float] | None]:
    """Per virtual stage the EP seconds of F and of B an overlapped pair can hide (DualPipeV:
    ``f_comm``, ``b_comm`` of the simulator); (None, None) for the other schedules."""
    if schedule != "dualpipev":
        return None, None
    return [sum(p.ep_fwd_s * n for p, n in bag) for bag in bags], [sum(p.ep_bwd_s * n for p, n in bag) for bag in bags]


def boundary(ctx: PlanContext) -> Boundary:
    """One boundary activation, ``b·(s/cp)·h·e`` bytes (e: ``ctx.activation_bytes``): what each tp
    rank sends, the seconds of one stage-to-stage send on the slowest hop (the last rank back to the
    first too under the interleaved schedule), that hop, and the all-gather part of those seconds.

    Every tp rank sends 1/tp of it: under SP the activation is sequence-sharded already; without
    SP Megatron's scatter/gather (``scatter_gather_tensors_in_pipeline``) and DeepSpeed split the
    replicated activation over the tp group, send the slices, and all-gather them on the
    receiving stage over its tp group (NVLink), which lies on the receiver's critical path."""
    plan, mesh, prices = ctx.plan, ctx.mesh, ctx.prices
    if plan.pp == 1:
        return NO_BOUNDARY
    full = plan.mbs * ctx.seq_len / plan.cp * ctx.hidden * ctx.activation_bytes
    per_rank = full / plan.tp
    hop_s, hop = prices.slowest_hop(per_rank, mesh.group(Axis.PP.value), closed=plan.schedule == "interleaved")
    gather = 0.0 if plan.sp else prices.collective("all_gather", full, mesh.group(Axis.TP.value))
    return Boundary(per_rank, hop_s + gather, hop, gather)
