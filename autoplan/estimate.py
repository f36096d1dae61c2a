"""Price any Plan: step time, MFU, memory per GPU, and every collective's placement.

One function, ``estimate``, prices a plan; the search, the baselines, the explainer, the
benchmark harness and the published-run validation all call it (through ``Estimator``,
which keeps the per-block caches so that pricing many plans of one model is cheap).

How a step is priced (all times seconds, per GPU)
-------------------------------------------------
1. **Blocks.**  Each unique block kind is sharded on its tp group by the block ILP
   (``search.sharding``); for standard transformer blocks this is Megatron's column→row
   sharding (and SP's reduce-scatter/all-gather pairs), which the ILP rediscovers.  That
   gives per micro-batch: forward, input-gradient (B) and weight-gradient (W) compute, the
   tp collectives, saved-activation bytes and parameters per GPU.  The pre part
   (embedding) and the post part (final norm, head, loss) are sharded the same way.
2. **Axes with fixed roles.**  cp: ring attention passes K/V chunks around the cp group
   (P2P, overlapped with the attention kernels; exposed = max(0, comm − attention)),
   Ulysses re-shards q, k, v and the output with all-to-alls (exposed), USP does Ulysses
   inside the NVLink domain and ring across.  ep: each MoE layer dispatches and combines
   tokens with two all-to-alls forward and two backward on the ep group.
3. **Pipeline.**  Virtual stage times F/B/W (block times × layers, plus embedding on the
   first and head+loss on the last, plus exposed communication) go to the event
   simulator of ``costmodels.pipeline`` with the stage-to-stage P2P time.
4. **Data parallel.**  Gradients are reduced over the dense dp group (cp·dp ranks) and the
   expert dp group; by ZeRO stage: 0 all-reduce, 1–2 reduce-scatter + parameter
   all-gather, 3 per-micro-batch all-gathers forward and backward + reduce-scatter.
   With ``overlap_grad_reduce`` the reduction hides behind the last micro-batch's
   backward (and the parameter all-gather behind the first forward).
5. **Step** = pipeline makespan + exposed DP communication + tied-embedding gradient
   all-reduce + optimizer step (memory bound: ~``OPTIMIZER_BYTES_PER_PARAM`` bytes of HBM
   traffic per parameter shard).

MFU = model FLOPs / (step time · GPUs · peak), model FLOPs being the GEMM and attention
FLOPs of forward + backward (Korthikanti/Megatron: no recompute, full s² attention);
HFU adds recomputation.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from autoplan.errors import UserError
from autoplan.ir import BlockGraph, OpGraph
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.search.sharding import (BlockAssignment, BlockSharding, ShardingContext, price_assignment,
                                      solve_assignment)
from costmodels import compute
from costmodels.collectives import collective_time
from costmodels.memory import GIB, OVERHEAD_BYTES, model_state_bytes
from costmodels.pipeline import simulate
from topologies.cluster import Cluster

OPTIMIZER_BYTES_PER_PARAM = 32.0   # Adam: read fp32 master, m, v, grad (16 B), write master, m, v (12 B), bf16 param (2 B), rounded
GRAD_REDUCE_BYTES = 4.0            # gradients reduced in fp32 (Megatron bf16 default, FSDP reduce_dtype fp32)
PARAM_GATHER_BYTES = 2.0           # parameters gathered in bf16
ATTENTION_OPS = ("attention",)


@dataclass(frozen=True)
class EstimateOptions:
    overlap_grad_reduce: bool = True      # DP reduction overlaps the last backward (Megatron --overlap-grad-reduce, FSDP)
    allow_cross_domain: bool = False      # let per-layer collectives leave the NVLink domain
    profile: str | None = None            # path to a compute profile YAML (default: the GPU's)
    solver: str = "cpsat"
    time_limit_s: float = 30.0


@dataclass(frozen=True)
class Primitive:
    """One class of collective of a plan, on the busiest pipeline rank, per training step."""

    kind: str              # all_reduce | reduce_scatter | all_gather | all_to_all | p2p
    dim: str               # tp | sp | cp | ep | pp | dp | embed
    group_size: int
    span: str              # "NVLink", "IB rail", "IB spine", "across pods (1:7)"
    level: str             # nvlink | rail | spine | pod
    calls_per_step: int
    bytes_per_call: float
    time_s: float
    exposed_s: float


@dataclass(frozen=True)
class Violation:
    rule: str
    text: str


@dataclass(frozen=True)
class Estimate:
    plan: str
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    model_flops_per_step: float
    memory_gib: float
    memory_breakdown_gib: dict[str, float]
    fits: bool
    bubble_fraction: float
    comm_exposed_s: float
    violations: tuple[Violation, ...]
    primitives: tuple[Primitive, ...]
    # what the explainer and the report draw on
    comm_time_s: float = 0.0
    time_breakdown_s: dict[str, float] = field(default_factory=dict)
    memory_per_stage_gib: tuple[float, ...] = ()
    hbm_gib: float = 0.0
    attention_time_share: float = 0.0
    attention_flops_share: float = 0.0
    microbatches: int = 0
    stage_times_s: tuple[tuple[float, float, float], ...] = ()   # (F, B, W) per virtual stage
    ilp_gap: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["violations"] = [asdict(v) for v in self.violations]
        d["primitives"] = [asdict(p) for p in self.primitives]
        d["stage_times_s"] = [list(t) for t in self.stage_times_s]
        d["memory_per_stage_gib"] = list(self.memory_per_stage_gib)
        return d

    def to_json(self) -> str:
        return json.dumps(rounded(self.to_dict()), sort_keys=True)


def rounded(x):
    """Floats to 6 significant digits, recursively: stable, readable JSON (shared by every writer)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    return x


def estimate(model: BlockGraph, cluster: Cluster, plan: Plan, *, global_batch: int,
             options: EstimateOptions = EstimateOptions()) -> Estimate:
    """Price ``plan`` for ``model`` (traced at its sequence length) on ``cluster``."""
    return Estimator(model, cluster, options).estimate(plan, global_batch)


# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Part:
    """Per-micro-batch cost of one graph (a block, or the pre/post part) under a plan."""

    forward_s: float
    backward_s: float
    wgrad_s: float
    exposed_fwd_s: float         # communication on the critical path, forward
    exposed_bwd_s: float
    ep_fwd_s: float              # the EP all-to-all part of it (what DualPipeV's pairs can hide)
    ep_bwd_s: float
    saved_bytes: float
    dense_numel: int
    expert_numel: int
    model_flops: float           # per micro-batch (one sequence × mbs), GEMM + attention
    recompute_flops: float
    attention_s: float
    compute_s: float
    collectives: tuple           # (dim, kind, nbytes, seconds, exposed seconds, phase)


class Estimator:
    """Prices plans of one model on one cluster; caches block shardings across plans."""

    def __init__(self, model: BlockGraph, cluster: Cluster, options: EstimateOptions = EstimateOptions(),
                 *, enforce_rules: bool = False):
        """``enforce_rules``: the search's mode, where the block ILP may not place a per-layer
        collective outside the NVLink domain; hand plans are priced as written (and flagged)."""
        self.enforce_rules = enforce_rules
        self.model = model
        self.cluster = cluster
        self.options = options
        try:
            self.profile = compute.load_profile(cluster.gpu.name, options.profile)
        except (ValueError, OSError) as e:
            raise UserError(str(e), "pass --profile PATH to a compute profile YAML") from None
        self._blocks: dict[tuple, BlockSharding] = {}
        self._max_ilp_gap = 0.0                   # over every block sharding priced so far
        self._assignments: dict[tuple, BlockAssignment] = {}
        self._spans: dict[tuple, object] = {}
        self._parts: dict[tuple, _Part] = {}
        self._colls: dict[tuple, float] = {}
        self._attention_flops_per_sample = sum(_attention_flops(b.graph) * b.count for b in model.blocks)
        self._sims: dict[tuple, object] = {}
        self.info = model.model
        self.hidden = self.info.hidden or _hidden_of(model)

    # ---- pricing helpers ------------------------------------------------------------------------
    def op_seconds(self, kind, flops, nbytes, gemm):
        return compute.op_time(kind, flops, nbytes, peak_flops=self.cluster.gpu.bf16_flops,
                               hbm_bw=self.cluster.gpu.hbm_bw, profile=self.profile, gemm=gemm)

    def _span(self, ranks):
        key = tuple(ranks)
        span = self._spans.get(key)
        if span is None:
            span = self._spans[key] = self.cluster.span(key)
        return span

    def coll(self, kind: str, nbytes: float, ranks) -> float:
        """Seconds of one collective on the group ``ranks`` (memoised: the search asks often)."""
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        key = (kind, nbytes, tuple(ranks))
        hit = self._colls.get(key)
        if hit is None:
            hit = self._colls[key] = collective_time(kind, nbytes, self._span(ranks), self.cluster)
        return hit

    def simulate(self, schedule: str, pp: int, m: int, vpp: int, f, b, w, p2p: float, f_comm=None, b_comm=None):
        """The pipeline simulator, memoised on its inputs (plans that differ only in ZeRO stage
        or data-parallel layout share their pipeline)."""
        key = (schedule, pp, m, vpp, tuple(f), tuple(b), tuple(w), p2p,
               tuple(f_comm) if f_comm is not None else None, tuple(b_comm) if b_comm is not None else None)
        hit = self._sims.get(key)
        if hit is None:
            hit = self._sims[key] = simulate(schedule, stages=pp, microbatches=m, chunks=vpp, f=f, b=b, w=w,
                                             p2p=p2p, f_comm=f_comm, b_comm=b_comm)
            if len(self._sims) > 20000:
                self._sims.clear()
        return hit

    def sharding(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, tp_ranks) -> BlockSharding:
        """The block's tp sharding under ``plan``, priced at the plan's micro-batch and recompute.

        The ILP is solved once per (block, tp sub-mesh, sp) — every cost it weighs scales with
        the micro-batch, the sequence share and the recompute policy alike — and its layout
        re-priced for the plan."""
        span = self._span(tp_ranks)
        key = (graph_key, plan.tp, plan.sp, plan.mbs, plan.cp, recompute, span)
        hit = self._blocks.get(key)
        if hit is None:
            akey = (graph_key, plan.tp, plan.sp, span)
            assignment = self._assignments.get(akey)
            if assignment is None:
                # always solved at the same reference point (micro-batch 1, whole sequence, no
                # recompute), so a plan's price never depends on which plans were priced before it
                reference = plan.replace(mbs=1, cp=1, recompute=("none",))
                assignment = solve_assignment(graph, self._context(reference, "none", tp_ranks, span))
                self._assignments[akey] = assignment
            hit = price_assignment(graph, assignment, self._context(plan, recompute, tp_ranks, span))
            self._blocks[key] = hit
            self._max_ilp_gap = max(self._max_ilp_gap, hit.gap)
        return hit

    def _context(self, plan: Plan, recompute: str, tp_ranks, span) -> ShardingContext:
        forbid = span.level != "nvlink" and not self.options.allow_cross_domain
        return ShardingContext(
            tp=plan.tp, sp=plan.sp, mbs=plan.mbs, cp=plan.cp, recompute=recompute,
            op_seconds=self.op_seconds,
            tp_seconds=lambda kind, nbytes: self.coll(kind, nbytes, tp_ranks),
            forbid_tp_collectives=forbid and self.enforce_rules,
            backend=self.options.solver, time_limit_s=self.options.time_limit_s)

    # ---- one graph under a plan ------------------------------------------------------------------
    def part(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, mesh: Mesh) -> _Part:
        """Per-micro-batch cost of one graph under ``plan`` (cached: it depends only on the
        tp/cp/ep degrees, their groups, sp, cp_algo, the micro-batch and the recompute policy)."""
        key = (graph_key, plan.tp, plan.sp, plan.cp, plan.cp_algo, plan.ep, plan.mbs, recompute,
               mesh.group("tp"), mesh.group("cp"), mesh.group("ep"))
        hit = self._parts.get(key)
        if hit is None:
            hit = self._parts[key] = self._part(graph_key, graph, plan, recompute, mesh)
        return hit

    def _part(self, graph_key: str, graph: OpGraph, plan: Plan, recompute: str, mesh: Mesh) -> _Part:
        tp_ranks = mesh.group("tp")
        bs = self.sharding(graph_key, graph, plan, recompute, tp_ranks)
        colls = []
        exp_f = exp_b = 0.0
        for c in bs.collectives:
            dim = "sp" if plan.sp and c.kind in ("reduce_scatter", "all_gather") else "tp"
            phase = "forward" if c.phase == "forward" else "backward"
            colls.append((dim, c.kind, c.nbytes, c.seconds, c.seconds, phase))
            if phase == "forward":
                exp_f += c.seconds
            else:
                exp_b += c.seconds
        scale = plan.mbs
        gemm_attn = sum(n.flops for n in graph.ops() if n.gemm is not None or "attention" in n.op)
        model_flops = gemm_attn * scale
        rec_flops = (sum(n.flops for n in graph.ops("forward") if n.gemm is not None or "attention" in n.op)
                     * scale if recompute == "full" else
                     sum(n.flops for n in graph.ops("forward") if _is_attention_op(n)) * scale
                     if recompute == "selective" else 0.0)
        attention_s = self._attention_seconds(graph, plan)
        # CP and EP communication
        cp_f, cp_b, cp_colls = self._cp_cost(graph, plan, mesh, attention_s)
        ep_f, ep_b, ep_colls = self._ep_cost(graph, plan, mesh)
        dense, expert = _param_split(graph, bs, plan)
        return _Part(
            forward_s=bs.forward_s, backward_s=bs.backward_s, wgrad_s=bs.wgrad_s,
            exposed_fwd_s=exp_f + cp_f + ep_f, exposed_bwd_s=exp_b + cp_b + ep_b, ep_fwd_s=ep_f, ep_bwd_s=ep_b,
            saved_bytes=bs.saved_bytes, dense_numel=dense, expert_numel=expert,
            model_flops=model_flops, recompute_flops=rec_flops,
            attention_s=attention_s, compute_s=bs.forward_s + bs.backward_s + bs.wgrad_s,
            collectives=tuple(colls + cp_colls + ep_colls))

    def _attention_seconds(self, graph: OpGraph, plan: Plan) -> float:
        """Compute seconds of the attention core (kernels and s×s score ops), per micro-batch, per GPU."""
        total = 0.0
        for n in graph.ops():
            if _is_attention_op(n):
                kind = ("attention_bwd" if "backward" in n.op else "attention_fwd") if "attention" in n.op else (
                    "gemm" if n.gemm else "memory")
                gemm = None
                if n.gemm:
                    m, nn, k = n.gemm
                    gemm = (m * plan.mbs / plan.cp, nn, k)
                total += self.op_seconds(kind, n.flops * plan.mbs / plan.cp / plan.tp,
                                         (n.bytes_read + n.bytes_written) * plan.mbs / plan.cp / plan.tp, gemm)
        return total

    def _cp_cost(self, graph: OpGraph, plan: Plan, mesh: Mesh, attention_s: float):
        """Exposed forward/backward seconds of context parallelism, and its collectives."""
        if plan.cp == 1 or not _has_attention(graph):
            return 0.0, 0.0, []
        cp_ranks = mesh.group("cp")
        kv_heads = self.info.kv_heads or self.info.heads
        head_dim = self.info.head_dim or (self.hidden // max(self.info.heads, 1))
        tokens = plan.mbs * self.model.seq_len / plan.cp
        kv_bytes = 2 * tokens * kv_heads * head_dim * 2 / plan.tp          # K and V chunk, bf16
        qo_bytes = tokens * self.hidden * 2 / plan.tp                       # one of q/k/v/o, bf16 (per-rank send)
        att_f = attention_s / 3.0                                           # fwd ≈ 1/3 of fwd+bwd attention
        att_b = attention_s - att_f
        colls = []
        ring_n, ulysses_n = plan.cp, 1
        if plan.cp_algo == "ulysses":
            ring_n, ulysses_n = 1, plan.cp
        elif plan.cp_algo == "usp":
            # Ulysses inside the NVLink domain (as far as the heads allow), ring across
            inner = max(1, min(plan.cp, self.cluster.nvlink_domain // (plan.tp * _stride_inner(mesh, "cp"))))
            while plan.cp % inner:
                inner -= 1
            ulysses_n, ring_n = inner, plan.cp // inner
        exp_f = exp_b = 0.0
        if ulysses_n > 1:
            u_ranks = cp_ranks[:ulysses_n]
            t = self.coll("all_to_all", qo_bytes, u_ranks)
            colls.append(("cp", "all_to_all", qo_bytes, 4 * t, 4 * t, "forward"))
            colls.append(("cp", "all_to_all", qo_bytes, 4 * t, 4 * t, "backward"))
            exp_f += 4 * t
            exp_b += 4 * t
        if ring_n > 1:
            ring_ranks = cp_ranks[::ulysses_n][:2]
            step = self.coll("p2p", kv_bytes * ulysses_n, ring_ranks)
            fwd = (ring_n - 1) * step
            bwd = 2 * (ring_n - 1) * step                                   # K/V and their gradients
            e_f = max(0.0, fwd - att_f)
            e_b = max(0.0, bwd - att_b)
            colls.append(("cp", "p2p", kv_bytes * ulysses_n, fwd, e_f, "forward"))
            colls.append(("cp", "p2p", kv_bytes * ulysses_n, bwd, e_b, "backward"))
            exp_f += e_f
            exp_b += e_b
        return exp_f, exp_b, colls

    def _ep_cost(self, graph: OpGraph, plan: Plan, mesh: Mesh):
        """MoE token dispatch and combine: 2 all-to-alls forward, 2 backward, on the ep group."""
        if plan.ep == 1 or not _is_moe(graph):
            return 0.0, 0.0, []
        topk = self.info.topk or 1
        tokens = plan.mbs * self.model.seq_len / plan.cp / (plan.tp if plan.sp else 1)
        nbytes = tokens * topk * self.hidden * 2
        t = self.coll("all_to_all", nbytes, mesh.group("ep"))
        colls = [("ep", "all_to_all", nbytes, 2 * t, 2 * t, "forward"),
                 ("ep", "all_to_all", nbytes, 2 * t, 2 * t, "backward")]
        return 2 * t, 2 * t, colls

    # ---- the whole plan ---------------------------------------------------------------------
    def check(self, plan: Plan, global_batch: int) -> None:
        info = self.info
        plan.validate(num_gpus=self.cluster.num_gpus, num_layers=self.model.num_layers,
                      heads=info.heads, kv_heads=info.kv_heads, experts=info.experts,
                      seq=self.model.seq_len, global_batch=global_batch)

    def layer_work(self, plan: Plan) -> dict:
        """Per micro-batch F+B+W seconds of every layer (model order) and of pre/post, no recompute.

        What the stage-cut DP balances."""
        mesh = Mesh.of(plan)
        work = {}
        for kind in dict.fromkeys((*self.model.order, "@pre", "@post")):
            p = self.part(kind, self._graph(kind), plan, "none", mesh)
            work[kind] = p.forward_s + p.backward_s + p.wgrad_s + p.exposed_fwd_s + p.exposed_bwd_s
        return {"layers": [work[k] for k in self.model.order], "pre": work["@pre"], "post": work["@post"]}

    def _graph(self, kind: str) -> OpGraph:
        """The graph of a block kind, or of the part before ("@pre") / after ("@post") the blocks."""
        if kind == "@pre":
            return self.model.pre
        if kind == "@post":
            return self.model.post
        return self.model.block(kind).graph

    def _counted_parts(self, plan: Plan, mesh: Mesh) -> list[tuple[_Part, int]]:
        """Every graph of the model under ``plan`` (no recompute), with how often it occurs."""
        kinds = [(b.kind, b.count) for b in self.model.blocks] + [("@pre", 1), ("@post", 1)]
        return [(self.part(k, self._graph(k), plan, "none", mesh), n) for k, n in kinds]

    def lower_bound(self, plan: Plan, global_batch: int) -> float:
        """A lower bound on ``estimate(plan).step_time_s`` for any stage cut, schedule and
        recomputation of ``plan``'s mesh and micro-batch size (what the search prunes with).

        m micro-batches × (F + B + W + exposed per-layer communication of all layers, embedding
        and head, no recompute) / pp — the average pipeline rank's busy time, which the
        makespan cannot beat — plus, under ZeRO-2/3, the per-micro-batch data-parallel traffic
        that compute cannot hide (at the average rank), plus the optimizer step.  With DualPipeV
        possible (pp > 1, MoE) the all-to-all a pair can hide is left out."""
        mesh = Mesh.of(plan)
        m = plan.microbatches(global_batch)
        work = hideable = 0.0
        dense = expert = 0.0
        for p, count in self._counted_parts(plan, mesh):
            work += count * (p.forward_s + p.backward_s + p.wgrad_s + p.exposed_fwd_s + p.exposed_bwd_s)
            hideable += count * (p.ep_fwd_s + p.ep_bwd_s)
            dense += p.dense_numel * count
            expert += p.expert_numel * count
        if plan.pp > 1 and hideable:
            work -= hideable
        per_rank_mb = work / plan.pp
        bound = m * per_rank_mb
        if plan.zero >= 2 and self.options.overlap_grad_reduce:
            colls, _ = self._dp_comm(plan, dense / plan.pp, expert / plan.pp, mesh.group("dp"), mesh.group("edp"),
                                     m, last_backward=0.0, first_forward=0.0)
            per_mb = sum(c[3] for c in colls if c[5] in ("zero3", "grad_mb")) / m
            bound += m * max(0.0, per_mb - per_rank_mb)
        shard = len(mesh.group("dp")) if plan.zero >= 1 else 1
        bound += (dense + expert) / plan.pp / shard * OPTIMIZER_BYTES_PER_PARAM / (
            self.cluster.gpu.hbm_bw * self.profile.memory_fraction)
        return bound

    def state_bytes_lower_bound(self, plan: Plan) -> float:
        """Bytes per GPU no cut of ``plan``'s mesh can avoid: model states of an even share of
        the parameters under its ZeRO stage, plus the fixed reserve."""
        mesh = Mesh.of(plan)
        dense = expert = 0.0
        for p, count in self._counted_parts(plan, mesh):
            dense += p.dense_numel * count
            expert += p.expert_numel * count
        d = model_state_bytes(dense / plan.pp, zero=plan.zero, dp=len(mesh.group("dp")))
        e = model_state_bytes(expert / plan.pp, zero=plan.zero, dp=len(mesh.group("edp")))
        return d.total + e.total + OVERHEAD_BYTES

    def estimate(self, plan: Plan, global_batch: int, *, detail: bool = True) -> Estimate:
        """Price ``plan``.  ``detail=False`` (the search's inner loop) skips what only the report
        needs: the exposed share of stage-to-stage P2P (a second simulation) and the
        per-primitive table."""
        self.check(plan, global_batch)
        mesh = Mesh.of(plan)
        gpu = self.cluster.gpu
        m = plan.microbatches(global_batch)
        chunks = plan.pp * plan.vpp
        layers_per_chunk = plan.stage_layers(self.model.num_layers)
        kinds = self.model.order
        # which layers go to which virtual stage
        chunk_layers, start = [], 0
        for n in layers_per_chunk:
            chunk_layers.append(kinds[start:start + n])
            start += n
        rank_of_chunk = [plan.stage_rank(c) for c in range(chunks)]
        recompute_of_rank = [plan.recompute_of_stage(r) for r in range(plan.pp)]

        parts: dict[tuple[str, str], _Part] = {}

        def part(kind: str, recompute: str) -> _Part:
            key = (kind, recompute)
            if key not in parts:
                parts[key] = self.part(kind, self._graph(kind), plan, recompute, mesh)
            return parts[key]

        # each virtual stage as a bag of (part, how many layers of it), pre/post once
        f, b, w, f_comm, b_comm = [], [], [], [], []
        chunk_bags: list[list[tuple[_Part, int]]] = []
        for c in range(chunks):
            rc = recompute_of_rank[rank_of_chunk[c]]
            bag = [(part(k, rc), n) for k, n in Counter(chunk_layers[c]).items()]
            if c == 0:
                bag.append((part("@pre", "none"), 1))
            if c == chunks - 1:
                bag.append((part("@post", "none"), 1))
            chunk_bags.append(bag)
            f.append(sum((p.forward_s + p.exposed_fwd_s) * n for p, n in bag))
            b.append(sum((p.backward_s + p.exposed_bwd_s) * n for p, n in bag))
            w.append(sum(p.wgrad_s * n for p, n in bag))
            # DualPipeV hides the MoE all-to-all of one micro-batch under the other's compute
            # (DeepSeek-V3 §3.2.1); TP/CP collectives stay on each layer's critical path
            f_comm.append(sum(p.ep_fwd_s * n for p, n in bag))
            b_comm.append(sum(p.ep_bwd_s * n for p, n in bag))

        # pipeline
        act_bytes = plan.mbs * self.model.seq_len / plan.cp * self.hidden * 2 / (plan.tp if plan.sp else 1)
        pp_ranks = mesh.group("pp")
        p2p = self.coll("p2p", act_bytes, pp_ranks[:2]) if plan.pp > 1 else 0.0
        schedule = plan.schedule if plan.pp > 1 else "1f1b"
        overlap = schedule == "dualpipev"
        sim = self.simulate(schedule, plan.pp, m, plan.vpp, f, b, w, p2p,
                            f_comm if overlap else None, b_comm if overlap else None)
        pipe_time = sim.step_time
        p2p_exposed = 0.0
        if plan.pp > 1 and detail:
            no_p2p = self.simulate(schedule, plan.pp, m, plan.vpp, f, b, w, 0.0,
                                   f_comm if overlap else None, b_comm if overlap else None)
            p2p_exposed = max(0.0, pipe_time - no_p2p.step_time)

        # per pipeline rank: parameters, data-parallel communication, memory
        dp_ranks, edp_ranks = mesh.group("dp"), mesh.group("edp")
        rank_chunks = [[c for c in range(chunks) if rank_of_chunk[c] == r] for r in range(plan.pp)]
        dp_exposed_by_rank, dp_colls_by_rank, mem_by_rank, states_by_rank = [], [], [], []
        for r in range(plan.pp):
            bag = [pn for c in rank_chunks[r] for pn in chunk_bags[c]]
            dense = sum(p.dense_numel * n for p, n in bag)
            expert = sum(p.expert_numel * n for p, n in bag)
            colls, exposed = self._dp_comm(plan, dense, expert, dp_ranks, edp_ranks, m,
                                           last_backward=sum(b[c] + w[c] for c in rank_chunks[r]),
                                           first_forward=sum(f[c] for c in rank_chunks[r]))
            dp_colls_by_rank.append(colls)
            dp_exposed_by_rank.append(exposed)
            st_dense = model_state_bytes(dense, zero=plan.zero, dp=len(dp_ranks))
            st_exp = model_state_bytes(expert, zero=plan.zero, dp=len(edp_ranks))
            per_chunk_act = [sum(p.saved_bytes * n for p, n in chunk_bags[c]) for c in rank_chunks[r]]
            inflight = sim.peak_activations[r]
            act = inflight * (sum(per_chunk_act) / max(len(per_chunk_act), 1))
            if chunks - 1 in rank_chunks[r]:
                act += self._logits_bytes(plan)
            other = OVERHEAD_BYTES
            if plan.zero >= 3:   # two layers' parameters gathered at once (prefetch)
                biggest = max((p.dense_numel + p.expert_numel for p, _ in bag), default=0)
                other += 2 * biggest * 2 * len(dp_ranks) / len(dp_ranks)
            br = {"params": st_dense.params + st_exp.params, "grads": st_dense.grads + st_exp.grads,
                  "optimizer": st_dense.optimizer + st_exp.optimizer, "activations": act, "other": other}
            states_by_rank.append((dense, expert))
            mem_by_rank.append(br)
        dp_exposed = max(dp_exposed_by_rank)
        # tied embedding: first and last stage all-reduce the embedding gradient
        embed_s, embed_bytes = 0.0, 0.0
        if plan.pp > 1 and self.info.tied_embeddings and self.info.vocab:
            embed_bytes = self.info.vocab * self.hidden / plan.tp * GRAD_REDUCE_BYTES
            embed_s = self.coll("all_reduce", embed_bytes, (pp_ranks[0], pp_ranks[-1]))
        # optimizer step
        max_numel = max(d + e for d, e in states_by_rank)
        shard = max(len(dp_ranks), 1) if plan.zero >= 1 else 1
        optimizer_s = max_numel / shard * OPTIMIZER_BYTES_PER_PARAM / (gpu.hbm_bw * self.profile.memory_fraction)
        step = pipe_time + dp_exposed + embed_s + optimizer_s

        # model FLOPs and utilisation
        counts = {b.kind: b.count for b in self.model.blocks}
        per_sample = sum(part(k, "none").model_flops * n for k, n in counts.items()) / plan.mbs
        per_sample += (part("@pre", "none").model_flops + part("@post", "none").model_flops) / plan.mbs
        model_flops = per_sample * global_batch
        rec_flops = sum(p.recompute_flops * n for bag in chunk_bags for p, n in bag) / plan.mbs * global_batch
        peak = gpu.bf16_flops * self.cluster.num_gpus
        mfu = model_flops / (step * peak)
        hfu = (model_flops + rec_flops) / (step * peak)

        # memory: the fullest pipeline rank
        totals = [sum(br.values()) for br in mem_by_rank]
        worst = max(range(plan.pp), key=lambda r: totals[r])
        mem = mem_by_rank[worst]

        # primitives and the time breakdown on the busiest rank (most busy seconds; ties: the first),
        # so that pp_bubble is the idle time no rank can avoid, not stage imbalance
        busy_rank = max(range(plan.pp), key=lambda r: (sim.busy[r], -r))
        primitives = self._primitives(plan, mesh, m, rank_chunks[busy_rank], chunk_bags, act_bytes, p2p, p2p_exposed,
                                      dp_colls_by_rank[busy_rank], dp_exposed_by_rank[busy_rank],
                                      embed_bytes, embed_s) if detail else []
        comm_time = sum(p.time_s for p in primitives)
        comm_exposed = sum(p.exposed_s for p in primitives)

        violations = self._violations(plan, mesh, totals[worst])
        block_compute = sum(p.compute_s * n for c in rank_chunks[busy_rank] for p, n in chunk_bags[c])
        attention = sum(p.attention_s * n for c in rank_chunks[busy_rank] for p, n in chunk_bags[c])
        all_flops = sum(part(k, "none").model_flops * n for k, n in counts.items())
        attn_flops = self._attention_flops_per_sample * plan.mbs
        busy_compute = m * block_compute
        breakdown = {
            "compute": busy_compute,
            "tp_comm": sum(p.time_s for p in primitives if p.dim in ("tp", "sp")),
            "cp_comm_exposed": sum(p.exposed_s for p in primitives if p.dim == "cp"),
            "ep_comm_exposed": sum(p.exposed_s for p in primitives if p.dim == "ep"),
            "pp_bubble": max(0.0, pipe_time - sim.busy[busy_rank] - p2p_exposed),
            "pp_p2p_exposed": p2p_exposed,
            "dp_exposed": dp_exposed,
            "embed_sync": embed_s,
            "optimizer": optimizer_s,
        }
        tokens = global_batch * self.model.seq_len
        return Estimate(
            plan=plan.to_string(),
            step_time_s=step,
            tokens_per_s=tokens / step,
            tokens_per_s_per_gpu=tokens / step / self.cluster.num_gpus,
            mfu=mfu, hfu=hfu, model_flops_per_step=model_flops,
            memory_gib=totals[worst] / GIB,
            memory_breakdown_gib={k: v / GIB for k, v in mem.items()},
            fits=totals[worst] <= gpu.hbm_bytes,
            bubble_fraction=sim.bubble_fraction,
            comm_exposed_s=comm_exposed,
            violations=tuple(violations),
            primitives=tuple(primitives),
            comm_time_s=comm_time,
            time_breakdown_s=breakdown,
            memory_per_stage_gib=tuple(t / GIB for t in totals),
            hbm_gib=gpu.hbm_bytes / GIB,
            attention_time_share=attention / block_compute if block_compute else 0.0,
            attention_flops_share=attn_flops / all_flops if all_flops else 0.0,
            microbatches=m,
            stage_times_s=tuple(zip(f, b, w)),
            ilp_gap=self._max_ilp_gap,
        )

    def _logits_bytes(self, plan: Plan) -> float:
        """fp32 logits and their gradient on the last stage: mbs·(s/cp)·V/tp · 4 B · 2."""
        vocab = self.info.vocab or 0
        return plan.mbs * self.model.seq_len / plan.cp * vocab / plan.tp * 4 * 2

    def _dp_comm(self, plan: Plan, dense: float, expert: float, dp_ranks, edp_ranks, m: int,
                 last_backward: float, first_forward: float):
        """Data-parallel collectives of one pipeline rank and the seconds they add to the step."""
        colls = []   # (kind, nbytes, calls, seconds total, group ranks)
        for numel, ranks in ((dense, dp_ranks), (expert, edp_ranks)):
            if numel == 0 or len(ranks) <= 1:
                continue
            grads = numel * GRAD_REDUCE_BYTES
            params = numel * PARAM_GATHER_BYTES
            if plan.zero == 0:
                colls.append(("all_reduce", grads, 1, self.coll("all_reduce", grads, ranks), ranks, "grad"))
            elif plan.zero == 1:
                colls.append(("reduce_scatter", grads, 1, self.coll("reduce_scatter", grads, ranks), ranks, "grad"))
                colls.append(("all_gather", params, 1, self.coll("all_gather", params, ranks), ranks, "param"))
            elif plan.zero == 2:
                # sharded gradients cannot accumulate whole: every micro-batch reduce-scatters its own
                t_rs = self.coll("reduce_scatter", grads, ranks)
                colls.append(("reduce_scatter", grads, m, m * t_rs, ranks, "grad_mb"))
                colls.append(("all_gather", params, 1, self.coll("all_gather", params, ranks), ranks, "param"))
            else:
                t_ag = self.coll("all_gather", params, ranks)
                t_rs = self.coll("reduce_scatter", grads, ranks)
                colls.append(("all_gather", params, 2 * m, 2 * m * t_ag, ranks, "zero3"))
                colls.append(("reduce_scatter", grads, m, m * t_rs, ranks, "zero3"))
        if not colls:
            return colls, 0.0
        per_mb = sum(c[3] for c in colls if c[5] in ("zero3", "grad_mb")) / m
        once_grad = sum(c[3] for c in colls if c[5] == "grad")
        once_param = sum(c[3] for c in colls if c[5] == "param")
        if not self.options.overlap_grad_reduce:
            return colls, m * per_mb + once_grad + once_param
        # per micro-batch traffic (ZeRO-2 gradient reduce-scatter, ZeRO-3 gathers) hides behind
        # that micro-batch's compute (prefetch); once-per-step traffic behind the last backward
        # (gradients) and the first forward (parameter all-gather), as Megatron overlaps them
        exposed = m * max(0.0, per_mb - (first_forward + last_backward))
        exposed += max(0.0, once_grad - last_backward) + max(0.0, once_param - first_forward)
        return colls, exposed

    def _primitives(self, plan, mesh, m, chunks_of_rank, chunk_bags, p2p_bytes, p2p, p2p_exposed, dp_colls,
                    dp_exposed, embed_bytes, embed_s) -> list[Primitive]:
        groups = {"tp": mesh.group("tp"), "sp": mesh.group("tp"), "cp": mesh.group("cp"),
                  "ep": mesh.group("ep"), "pp": mesh.group("pp")}
        acc: dict[tuple, list] = {}

        def add(kind, dim, ranks, calls, nbytes, seconds, exposed):
            if len(ranks) <= 1:
                return
            span = self._span(ranks)
            key = (kind, dim, len(ranks), span.level)
            a = acc.setdefault(key, [self.cluster.describe_span(span), 0, 0.0, 0.0, 0.0])
            a[1] += calls
            a[2] += nbytes * calls
            a[3] += seconds
            a[4] += exposed

        for c in chunks_of_rank:
            for p, n in chunk_bags[c]:
                for dim, kind, nbytes, seconds, exposed, _ in p.collectives:
                    calls = m * (4 if dim == "cp" and kind == "all_to_all" else 1)
                    if dim == "cp" and kind == "p2p":
                        calls = m * max(1, round(seconds / max(self.coll("p2p", nbytes, groups["cp"][:2]), 1e-30)))
                    if dim == "ep":
                        calls = 2 * m
                    add(kind, dim, groups[dim], n * calls, nbytes, n * m * seconds, n * m * exposed)
        if plan.pp > 1:
            sends = 2 * m * len(chunks_of_rank)
            add("p2p", "pp", groups["pp"][:2], sends, p2p_bytes, sends * p2p, p2p_exposed)
        dp_total = sum(c[3] for c in dp_colls)
        for kind, nbytes, calls, seconds, ranks, tag in dp_colls:
            # the exposed part of data-parallel traffic, shared in proportion to each collective's time
            add(kind, "dp", ranks, calls, nbytes, seconds, dp_exposed * seconds / dp_total if dp_total else 0.0)
        if embed_s:
            add("all_reduce", "embed", (groups["pp"][0], groups["pp"][-1]), 1, embed_bytes, embed_s, embed_s)
        out = []
        for (kind, dim, size, level), (span, calls, total_bytes, seconds, exposed) in sorted(acc.items()):
            out.append([kind, dim, size, span, level, calls, total_bytes / max(calls, 1), seconds, exposed])
        return [Primitive(*row) for row in out]

    def _violations(self, plan: Plan, mesh: Mesh, memory_bytes: float) -> list[Violation]:
        out = []
        for dim, name, active in (("tp", "TP/SP", plan.tp > 1),
                                  ("ep", "EP all-to-all", plan.ep > 1 and self.info.experts > 0),
                                  ("cp", "Ulysses all-to-all", plan.cp > 1 and plan.cp_algo == "ulysses")):
            if not active:
                continue
            ranks = mesh.group(dim)
            span = self._span(ranks)
            if span.level != "nvlink":
                out.append(Violation(
                    f"{dim}-inside-nvlink",
                    f"{name} group of {len(ranks)} ranks ({_ranks_text(ranks)}) spans {span.domains} NVLink "
                    f"domains over {self.cluster.describe_span(span)}: per-layer collectives leave NVLink"))
        if memory_bytes > self.cluster.gpu.hbm_bytes:
            out.append(Violation("memory", f"needs {memory_bytes / GIB:.1f} GiB per GPU, "
                                           f"{self.cluster.gpu.name} has {self.cluster.gpu.hbm_bytes / GIB:.1f} GiB"))
        return out


# --- small pure helpers -------------------------------------------------------------------------

def _stride_inner(mesh: Mesh, axis: str) -> int:
    """Product of the sizes of the axes between tp and ``axis`` (1 when adjacent)."""
    return max(1, mesh.stride(axis) // max(mesh.stride("tp") * mesh.size("tp"), 1))


def _is_score_op(n) -> bool:
    return any(t is not None and sum(r == "seq" for r in t.dim_roles) >= 2 for t in n.outputs)


def _is_attention_op(n) -> bool:
    """An attention kernel, or an op of eager attention's s×s scores (the attention core)."""
    return "attention" in n.op or _is_score_op(n)


def _has_attention(graph: OpGraph) -> bool:
    return any(_is_attention_op(n) for n in graph.ops())


def _attention_flops(graph: OpGraph) -> float:
    return sum(n.flops for n in graph.ops() if _is_attention_op(n))


def _is_moe(graph: OpGraph) -> bool:
    return any(n.out is not None and "expert" in n.out.dim_roles for n in graph.params())


def _param_split(graph: OpGraph, bs: BlockSharding, plan: Plan) -> tuple[int, int]:
    """(dense, expert) parameters one GPU holds for this graph: tp-sharded, experts also /ep."""
    dense = expert = 0
    for n in graph.params():
        pl = bs.param_placements.get(n.param or n.name, "R")
        numel = n.out.numel // (plan.tp if pl.startswith("S(") else 1)
        if "expert" in n.out.dim_roles:
            expert += numel // plan.ep
        else:
            dense += numel
    return dense, expert


def _hidden_of(model: BlockGraph) -> int:
    g = model.blocks[0].graph
    for n in g.nodes:
        if n.op == "placeholder" and n.role == "input" and n.out is not None:
            return n.out.shape[-1]
    return 0


def _ranks_text(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 4:
        return f"{ranks[0]}, {ranks[1]}, …, {ranks[-1]}"
    return ", ".join(map(str, ranks))
