"""Price any Plan: step time, MFU, memory per GPU, and every collective's placement.

``Estimator`` composes the per-parallelism pricers, one module each: ``tp`` (the block ILP's
layout), ``cp``, ``ep``, ``pp`` (stage bags → the pipeline simulator), ``dp`` (ZeRO 0–3 and the
optimizer step) and ``memory``; ``prices`` memoises the prices they share, ``memo`` holds what
the Estimator remembers across plans and ``report`` builds the primitive table.  How a step is
priced (seconds, per GPU):

1. every graph (block kinds, ``@pre``, ``@post``) → a per-micro-batch ``Part`` (``parts``);
2. virtual stages → F/B/W → the schedule's makespan (``pp``);
3. per pipeline rank: data-parallel collectives and their exposed share (``dp``), memory (``memory``);
4. step = makespan + the slowest rank's exposed DP traffic + tied-embedding gradient all-reduce
   (first and last stage) + optimizer step.

MFU = model FLOPs / (step · GPUs · peak), model FLOPs being the GEMM and attention FLOPs of
forward + backward (Korthikanti/Megatron: no recompute, full s² attention); HFU adds recomputation.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autoplan.axes import DENSE_DP, EXPERT_DP, Axis
from autoplan.cost import dp, fsdp, loss, memory, pp, report
from autoplan.cost.context import PlanContext, activation_bytes, block_input, hidden_of
from autoplan.cost.memo import BagKey, EstimatorMemo, LocalShape, PartKey, PlanAt
from autoplan.cost.parts import price_part
from autoplan.cost.prices import Prices
from autoplan.cost.tp import BlockLayouts, LayoutKey
from autoplan.cost.types import DpComm, Estimate, EstimateOptions, LayerWork, Part, Primitive, SimulationArgs
from autoplan.ir import BlockGraph, OpGraph
from autoplan.layout import BlockLayout, Layout
from autoplan.mesh import Mesh
from autoplan.opkinds import attention_flops
from autoplan.plan import Plan
from autoplan.sharding import BlockAssignment
from costmodels.memory import GIB
from costmodels.pipeline.live import peak_live
from topologies.cluster import Cluster


class Estimator:
    """Prices plans of one model on one cluster; remembers block layouts, parts, stage bags and
    pipelines across plans (``memo``: ``cost.memo.EstimatorMemo``)."""

    def __init__(self, model: BlockGraph, cluster: Cluster, options: EstimateOptions = EstimateOptions(),
                 *, enforce_rules: bool = False):
        self.model = model
        self.cluster = cluster
        self.options = options
        self.prices = Prices(cluster, options.profile, options.params, options.exact, options.attention_kernel)
        self.layouts = BlockLayouts(self.prices, options, enforce_rules=enforce_rules)
        self.info = model.model
        self.hidden = self.info.hidden or hidden_of(model)
        self.activation_bytes = activation_bytes(model.blocks[0].graph)   # of the residual stream, as traced
        self.memo = EstimatorMemo()
        self._attention_flops_per_sample = sum(attention_flops(b.graph) * b.count for b in model.blocks)
        self._fused_grad_bytes = loss.fused_grad_bytes(options.loss_kernel, model.post)

    def context(self, plan: Plan, mesh: Mesh) -> PlanContext:
        """``plan`` (its mesh ``mesh``) as the pricers read it, with this Estimator's facts."""
        return PlanContext(plan, mesh, self.prices, self.options, self.info, self.model.sample_positions, self.hidden,
                           self.activation_bytes)

    def graph(self, kind: str) -> OpGraph:
        """The graph of a block kind, or of the part before ("@pre") / after ("@post") the blocks."""
        return {"@pre": self.model.pre, "@post": self.model.post}.get(kind) or self.model.block(kind).graph

    def part(self, kind: str, plan: Plan, recompute: str, mesh: Mesh) -> Part:
        """Per-micro-batch cost of one graph under ``plan``, remembered on its ``PartKey``."""
        return self._part(PartKey(kind, recompute, LocalShape.of(plan, mesh)), plan, mesh)

    def _parts_of(self, plan: Plan, mesh: Mesh) -> Callable[[str], Part]:
        """``part(kind, plan, "none", mesh)`` for any kind, the local shape projected once."""
        local = LocalShape.of(plan, mesh)
        return lambda kind: self._part(PartKey(kind, "none", local), plan, mesh)

    def _part(self, key: PartKey, plan: Plan, mesh: Mesh) -> Part:
        """``part`` of ``key``, projected from ``plan`` and ``mesh``."""
        return self.memo.parts.get(key, lambda: price_part(
            self.context(plan, mesh), key.graph, self.graph(key.graph), key.recompute, self.layouts))

    def stage_bags(self, plan: Plan, mesh: Mesh) -> list[pp.Bag]:
        """``pp.stage_bags`` of ``plan`` (read-only), remembered on its ``BagKey`` — a mesh's
        schedules, ZeRO stages and floors ask for the same bags again."""
        key = BagKey.of(plan, mesh, self.model.num_layers)
        return self.memo.bags.get(key, lambda: pp.stage_bags(
            plan, self.model.order, self.model.num_layers,
            lambda kind, rc: self._part(PartKey(kind, rc, key.local), plan, mesh)))

    def simulation_args(self, plan: Plan, mesh: Mesh, m: int) -> SimulationArgs:
        """``pp.simulation_args`` of ``plan`` at ``m`` micro-batches, remembered (a band's
        sample asks for it to simulate its plans at once, then prices each plan with it)."""
        return self.memo.pipelines.get(PlanAt(plan, m), lambda: pp.simulation_args(
            self.context(plan, mesh), self.stage_bags(plan, mesh), m))

    def graph_kinds(self) -> list[tuple[str, int]]:
        """Every graph of the model — block kinds, then "@pre" and "@post" — with how often it occurs."""
        return [(b.kind, b.count) for b in self.model.blocks] + [("@pre", 1), ("@post", 1)]

    def layer_work(self, plan: Plan) -> LayerWork:
        """Per micro-batch F+B+W+exposed seconds of every layer (model order) and of pre/post, no
        recompute: what the stage-cut DP balances."""
        part = self._parts_of(plan, Mesh.of(plan))
        work = {k: part(k).work_s for k in dict.fromkeys((*self.model.order, "@pre", "@post"))}
        return LayerWork(tuple(work[k] for k in self.model.order), work["@pre"], work["@post"])

    def solve_layouts(self, plan: Plan) -> None:
        """Solve the block ILP of every graph for ``plan``'s tp group (what the search does before forking)."""
        mesh = Mesh.of(plan)
        for kind, _ in self.graph_kinds():
            self.layouts.sharding(kind, self.graph(kind), plan, "none", mesh)

    def unsolved_layouts(self, plan: Plan) -> list[tuple[LayoutKey, str]]:
        """(assignment key, graph kind) of every block ILP ``plan`` needs that is not solved yet."""
        mesh = Mesh.of(plan)
        keys = [(self.layouts.assignment_key(kind, plan, mesh), kind) for kind, _ in self.graph_kinds()]
        return [(key, kind) for key, kind in keys if key not in self.layouts.assignments]

    def solve_layout(self, kind: str, plan: Plan) -> BlockAssignment:
        """The block ILP of one graph at ``plan`` (a ``BlockAssignment``), not stored: workers solve
        in parallel and the parent keeps them (``store_layouts``)."""
        return self.layouts.solve(kind, self.graph(kind), plan, Mesh.of(plan))

    def store_layouts(self, solved: Mapping[LayoutKey, BlockAssignment]) -> None:
        """Keep block ILP solutions solved elsewhere (``solve_layout`` in the search's workers),
        by their ``unsolved_layouts`` keys, for every later pricing to read."""
        self.layouts.store(list(solved.items()))

    def solved_layouts(self) -> dict[LayoutKey, BlockAssignment]:
        """Every block ILP solution kept so far, by ``LayoutKey``."""
        return dict(self.layouts.assignments.items())  # type: ignore[arg-type]  # BlockLayouts keys it on LayoutKey

    def layout(self, plan: Plan) -> Layout | None:
        """The tp placements ``plan`` is priced with (block ILP solutions); None without tp."""
        if plan.tp == 1:
            return None
        mesh = Mesh.of(plan)
        blocks = []
        for kind, _ in self.graph_kinds():
            graph = self.graph(kind)
            bs = self.layouts.sharding(kind, graph, plan, plan.recompute_of_stage(0), mesh)
            entry = block_input(graph)
            stream = bs.placements.get(entry.name, "R") if entry is not None else "R"
            blocks.append(BlockLayout(kind, tuple(sorted(bs.param_placements.items())), stream))
        return Layout(plan.tp, plan.sp, tuple(blocks))

    def check(self, plan: Plan, global_batch: int) -> None:
        info = self.info
        plan.validate(num_gpus=self.cluster.num_gpus, num_layers=self.model.num_layers, heads=info.heads,
                      kv_heads=info.kv_heads, experts=info.experts, seq=self.model.sample_positions,
                      global_batch=global_batch)
        gpu = self.cluster.gpu
        plan.check_precision(gpu.name, gpu.precisions)

    def counted_parts(self, plan: Plan, mesh: Mesh) -> list[tuple[Part, int]]:
        """Every graph of the model under ``plan`` (no recompute), with how often it occurs."""
        part = self._parts_of(plan, mesh)
        return [(part(k), n) for k, n in self.graph_kinds()]

    def estimate(self, plan: Plan, global_batch: int, *, detail: bool = True) -> Estimate:
        """Price ``plan``.  ``detail=False`` (the search's inner loop) skips what only the report
        needs: the exposed share of stage-to-stage P2P (a second simulation) and the primitives."""
        ctx, m, pipe = self._pipeline(plan, global_batch, detail)
        pol = fsdp.policy(self.options, plan)
        mems = self.rank_memories(plan, ctx.mesh, pipe, m, pol)
        step = self._step(ctx, m, pipe, pol, [(x.dense_numel, x.expert_numel) for x in mems], detail=detail)
        busy = max(range(plan.pp), key=lambda r: (pipe.sim.busy[r], -r))
        # the data-parallel rows: the rank whose exposure the step charges (the busiest on ties)
        charged = max(range(plan.pp), key=lambda r: (step.dp_exposed[r], r == busy, -r))
        prims = report.primitives(ctx, m, pipe, busy, step.dp_colls[charged], step.embed_bytes,
                                  step.embed_s) if detail else []
        return self._assemble(ctx, global_batch, m, pipe, mems, prims, busy, step)

    def step_time_s(self, plan: Plan, global_batch: int) -> float:
        """``estimate(plan, global_batch, detail=False).step_time_s`` without what the step does not
        read (the activation peaks, MFU, the report): what a band prices once per sample.  Equal to
        the estimate's step to the bit (the same ``_step`` on the same per-rank parameter counts)."""
        ctx, m, pipe = self._pipeline(plan, global_batch, detail=False)
        pol = fsdp.policy(self.options, plan)
        return self._step(ctx, m, pipe, pol, [memory.rank_numels(pipe, r) for r in range(plan.pp)]).step_s

    def _step(self, ctx: PlanContext, m: int, pipe: pp.Pipeline, pol: fsdp.Policy,
              numels: list[tuple[float, float]], detail: bool = False) -> _Step:
        """Step = the pipeline's ``step_s`` (makespan, or steady step under post-validation) + the
        slowest rank's exposed DP traffic + tied-embedding sync + optimizer,
        from each pipeline rank's (dense, expert) parameter count.  ``detail``: each rank's
        ``dp_colls`` are the collectives its exposure is charged to (``dp.dp_exposed``)."""
        by_numels = {n: dp.dp_comms(ctx, n[0], n[1], m, pol) for n in dict.fromkeys(numels)}
        zero3: dict[_ChunksKey, fsdp.Exposure | None] = {}
        charged = [dp.dp_exposed(by_numels[n], m, overlap=self.options.overlap_grad_reduce,
                                 last_backward=sum(pipe.b[k] + pipe.w[k] for k in pipe.rank_chunks[r]),
                                 first_forward=sum(pipe.f[k] for k in pipe.rank_chunks[r]),
                                 zero3=self._zero3_exposed(ctx, pipe, r, pol, m, zero3, detail),
                                 hide=self.options.params.dp_overlap)
                   for r, n in enumerate(numels)]
        dp_exposed = [x for x, _ in charged]
        dp_colls = [c for _, c in charged]
        embed_bytes, embed_s = self.embedding_sync(ctx.plan, ctx.mesh)
        optimizer_s = max(dp.optimizer_seconds(ctx, d, e) for d, e in dict.fromkeys(numels))
        step = pipe.step_s + max(dp_exposed) + embed_s + optimizer_s
        return _Step(step, dp_colls, dp_exposed, embed_bytes, embed_s, optimizer_s)

    def _pipeline(self, plan: Plan, global_batch: int, detail: bool) -> tuple[PlanContext, int, pp.Pipeline]:
        """(context, micro-batches, priced pipeline) of a checked ``plan``."""
        self.check(plan, global_batch)
        ctx = self.context(plan, Mesh.of(plan))
        m = plan.microbatches(global_batch)
        return ctx, m, pp.price_pipeline(ctx, self.stage_bags(plan, ctx.mesh), self.simulation_args(plan, ctx.mesh, m),
                                         detail=detail)

    def memory_by_rank(self, plan: Plan, global_batch: int) -> list[memory.RankMemory]:
        """The memory of every pipeline rank as ``estimate`` prices it (``autoplan memcheck``
        compares each rank's ``breakdown()`` and ``alive`` with torch's)."""
        ctx, m, pipe = self._pipeline(plan, global_batch, detail=False)
        return self.rank_memories(plan, ctx.mesh, pipe, m)

    def _zero3_exposed(self, ctx: PlanContext, pipe: pp.Pipeline, rank: int, pol: fsdp.Policy, m: int,
                       memo: dict[_ChunksKey, fsdp.Exposure | None], detail: bool = False) -> fsdp.Exposure | None:
        """Exposed FSDP seconds of pipeline rank ``rank`` under ZeRO-2/3 (``fsdp``; with ``detail``
        the collectives charged), None otherwise.
        Per-layer collectives share the links when the dense dp group lies inside one NVLink domain.
        ``memo`` (one dict per plan): ranks whose chunks hold the same parts at the same ends share it."""
        if ctx.plan.zero < 2:
            return None
        last = len(pipe.bags) - 1
        key = tuple((tuple(pipe.bags[c]), c == 0, c == last) for c in pipe.rank_chunks[rank])
        if key in memo:
            return memo[key]
        dp_ranks = ctx.mesh.group(DENSE_DP)
        shared = len(dp_ranks) > 1 and self.prices.span(dp_ranks).level == "nvlink"
        chunks = [fsdp.chunk_units(ctx, pipe.bags[c], c == 0, c == last, shared) for c in pipe.rank_chunks[rank]]
        out = memo[key] = fsdp.step_exposure(chunks, pol, m, hide=self.options.params.dp_overlap, detail=detail)
        return out

    def rank_memories(self, plan: Plan, mesh: Mesh, pipe: pp.Pipeline, m: int,
                      pol: fsdp.Policy | None = None) -> list[memory.RankMemory]:
        """Per pipeline rank: states, the live activation peak of its schedule order, transients
        (reads the pipeline's bags only, so the search's floor can ask before simulating)."""
        schedule = plan.schedule if plan.pp > 1 else "1f1b"
        inputs = self.memory_inputs(plan, mesh, m)
        peaks = peak_live(schedule, plan.pp, m, plan.vpp, *memory.walk_bytes(pipe.bags, inputs["loss"]))
        pol = pol or fsdp.policy(self.options, plan)
        memo: dict[memory.RankKey, memory.BagStates] = {}
        return [memory.rank_memory(plan, pipe, r, peaks[r], memo=memo, pol=pol, **inputs) for r in range(plan.pp)]

    def memory_inputs(self, plan: Plan, mesh: Mesh, m: int) -> memory.MemoryInputs:
        """What ``memory.bag_states`` reads besides a rank's bag and the FSDP policy (keyword
        arguments; none of them reads the ZeRO stage)."""
        return memory.MemoryInputs(dense_dp=len(mesh.group(DENSE_DP)), expert_dp=len(mesh.group(EXPERT_DP)),
                    loss=memory.loss_bytes(plan, self.model.sample_positions, self.info.vocab or 0,
                                           self.options.kernels, self._fused_grad_bytes),
                    ends=frozenset(map(self._parts_of(plan, mesh), ("@pre", "@post"))),
                    microbatches=m, precision=memory.state_precision(self.options.state_precision),
                    fp8_engine=self.options.fp8_engine, fp8_params=self.options.fp8_params)

    @property
    def usable_bytes(self) -> float:
        """HBM per GPU less the memory margin: what a plan that fits may use."""
        return memory.usable_bytes(self.cluster.gpu.hbm_bytes, self.options.memory_margin_gib)

    def optimizer_seconds(self, plan: Plan, mesh: Mesh, numels: list[tuple[float, float]]) -> float:
        """The optimizer step of the rank holding the most parameters (``numels``: each pipeline
        rank's (dense, expert) count)."""
        ctx = self.context(plan, mesh)
        return max(dp.optimizer_seconds(ctx, d, e) for d, e in dict.fromkeys(numels))

    def embedding_sync(self, plan: Plan, mesh: Mesh) -> tuple[float, float]:
        """Tied embedding: the first and last stage all-reduce the embedding gradient (bytes, seconds)."""
        if plan.pp == 1 or not (self.info.tied_embeddings and self.info.vocab):
            return 0.0, 0.0
        pp_ranks = mesh.group(Axis.PP.value)
        nbytes = self.info.vocab * self.hidden / plan.tp * dp.GRAD_REDUCE_BYTES
        return nbytes, self.prices.collective("all_reduce", nbytes, (pp_ranks[0], pp_ranks[-1]))

    def _assemble(self, ctx: PlanContext, global_batch: int, m: int, pipe: pp.Pipeline,
                  mems: list[memory.RankMemory], prims: list[Primitive], busy: int, steps: _Step) -> Estimate:
        """MFU, memory and the breakdown on the busiest rank, into one Estimate."""
        plan, gpu, step = ctx.plan, self.cluster.gpu, steps.step_s
        counts = {b.kind: b.count for b in self.model.blocks}
        part = self._parts_of(plan, ctx.mesh)
        all_flops = sum(part(k).model_flops * n for k, n in counts.items())
        per_sample = all_flops / plan.mbs + (part("@pre").model_flops + part("@post").model_flops) / plan.mbs
        model_flops = per_sample * global_batch
        rec_flops = sum(p.recompute_flops * n for bag in pipe.bags for p, n in bag) / plan.mbs * global_batch
        peak = gpu.bf16_flops * self.cluster.num_gpus
        totals = [x.total for x in mems]
        worst = max(range(plan.pp), key=lambda r: totals[r])
        busy_bags = [pn for c in pipe.rank_chunks[busy] for pn in pipe.bags[c]]
        block_compute = sum(p.compute_s * n for p, n in busy_bags)
        attention = sum(p.attention_s * n for p, n in busy_bags)
        tokens = global_batch * self.model.sample_positions
        compute = m * block_compute
        return Estimate(
            plan=plan.to_string(), step_time_s=step, tokens_per_s=tokens / step,
            samples_per_s=global_batch / step, throughput_unit=self.model.throughput_unit,
            tokens_per_s_per_gpu=tokens / step / self.cluster.num_gpus,
            mfu=model_flops / (step * peak), hfu=(model_flops + rec_flops) / (step * peak),
            model_flops_per_step=model_flops, memory_gib=totals[worst] / GIB,
            memory_breakdown_gib={k: v / GIB for k, v in mems[worst].breakdown().items()},
            fits=totals[worst] <= self.usable_bytes, bubble_fraction=pp.bubble_fraction(pipe),
            comm_exposed_s=sum(p.exposed_s for p in prims),
            violations=tuple(report.violations(ctx, totals[worst])),
            primitives=tuple(prims), comm_time_s=sum(p.time_s for p in prims),
            time_breakdown_s=report.breakdown(prims, compute=compute, pipe=pipe, rank=busy,
                                              dp_exposed=max(steps.dp_exposed), embed_s=steps.embed_s,
                                              optimizer_s=steps.optimizer_s, microbatches=m),
            memory_per_stage_gib=tuple(t / GIB for t in totals), hbm_gib=gpu.hbm_bytes / GIB,
            memory_margin_gib=self.options.memory_margin_gib, activations_alive=mems[worst].alive,
            attention_time_share=attention / block_compute if block_compute else 0.0,
            attention_flops_share=self._attention_flops_per_sample * plan.mbs / all_flops if all_flops else 0.0,
            microbatches=m, stage_times_s=tuple(zip(pipe.f, pipe.b, pipe.w)),
            ilp_gap=max(p.ilp_gap for bag in pipe.bags for p, _ in bag))


# the chunks of a pipeline rank as FSDP prices them: (its (part, count) pairs, first chunk, last chunk) each
_ChunksKey = tuple[tuple[tuple[tuple[Part, int], ...], bool, bool], ...]


@dataclass(frozen=True)
class _Step:
    """A step's time and the per-rank DP pieces the report reads (``Estimator._step``)."""

    step_s: float
    dp_colls: list[list[DpComm]]
    dp_exposed: list[float]
    embed_bytes: float
    embed_s: float
    optimizer_s: float


def estimate(model: BlockGraph, cluster: Cluster, plan: Plan, *, global_batch: int,
             options: EstimateOptions = EstimateOptions()) -> Estimate:
    """Price ``plan`` for ``model`` (traced at its sequence length) on ``cluster``."""
    return Estimator(model, cluster, options).estimate(plan, global_batch)



