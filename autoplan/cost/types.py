"""The records the cost model passes between its modules and returns: Estimate and its parts, and
``EstimateOptions``, everything the cost model reads besides the plan, the graph and the cluster."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from autoplan.cost.params import NOMINAL, Params
from autoplan.errors import UserError
from autoplan.sharding.ilp import BACKENDS, Backend
from costmodels.attention import ATTENTION_KERNELS, AttentionKernel
from costmodels.memo import kept_hash, without_kept_hash
from costmodels.memory import STATE_PRECISION_NAMES, StatePrecisionName

DEFAULT_MARGIN_GIB = 4.0   # see autoplan.cost.memory: CUDA context + workspaces, NCCL buffers, fragmentation

GradSync = Literal["microbatch", "step"]     # when ZeRO-2/3 reduce-scatters gradients (cost.fsdp)
Kernels = Literal["eager", "megatron-core"]  # the engine's kernels where they save other activations (cost.kernels)
Fp8Engine = Literal["transformer-engine", "torchao"]   # what runs an FP8 plan's GEMMs (costmodels.precision)
Fp8Recompute = Literal["fp8", "bf16"]        # what a recomputed FP8 layer reruns in (sharding.price)
LossKernel = Literal["eager", "fused"]       # what computes the LM loss (cost.loss)
GRAD_SYNCS: tuple[GradSync, ...] = get_args(GradSync)
KERNELS: tuple[Kernels, ...] = get_args(Kernels)
FP8_ENGINES: tuple[Fp8Engine, ...] = get_args(Fp8Engine)
FP8_RECOMPUTES: tuple[Fp8Recompute, ...] = get_args(Fp8Recompute)
LOSS_KERNELS: tuple[LossKernel, ...] = get_args(LossKernel)


@dataclass(frozen=True)
class EstimateOptions:
    """How the cost model prices a plan: each option once, here.  The search nests it
    (``SearchOptions.estimate``); every pricing command sets it from its flags
    (``commands.common.add_estimate_args`` / ``estimate_options_from``).  A choice field's allowed
    values are its ``Literal``'s (``CHOICES``), checked on construction."""

    # DP reduction overlaps the last backward (Megatron --overlap-grad-reduce, FSDP)
    overlap_grad_reduce: bool = True
    allow_cross_domain: bool = False      # let per-layer collectives leave the NVLink domain (the search's rule)
    profile: str | None = None            # path to a compute profile YAML (default: the GPU's)
    solver: Backend = "cpsat"             # block ILP backend (autoplan.sharding.ilp)
    time_limit_s: float = 30.0            # per block ILP
    fsdp_prefetch: int = 1                # ZeRO-3: units gathered ahead (FSDP2's implicit prefetch is 1)
    fsdp_reshard_after_forward: bool | None = None   # ZeRO-3: None = the runtime's default (on at pp = 1, off under PP)
    fsdp_grad_sync: GradSync | None = None   # ZeRO-2/3 gradient reduce-scatter: "microbatch" (every micro-batch,
                                          # sharded fp32 accumulation) or "step" (once, unsharded fp32 accumulation
                                          # under no-sync); None = the runtime's default (FSDP2: "microbatch" at
                                          # pp = 1, "step" under PP)
    memory_margin_gib: float = DEFAULT_MARGIN_GIB   # head-room a plan must leave free (cost.memory docstring)
    # bytes per gradient element reduced over dp: fp32 (Megatron's main grads, FSDP2's reduce_dtype);
    # 2 where the stack reduces the fp16 grads (DeepSpeed fp16)
    grad_reduce_bytes: float = 4.0

    state_precision: StatePrecisionName = "megatron"   # zero 0/1 engine's state dtypes (costmodels.memory)
    kernels: Kernels = "eager"            # the engine's kernels where they save other activations (cost.kernels)
    # what computes the LM loss (cost.loss): "eager", the traced F.cross_entropy on fp32 logits (its
    # fp32 log-softmax saved, fp32 gradients at its backward); "fused", one softmax-cross-entropy
    # kernel on the bf16 logits that keeps them and writes their bf16 gradient (flash-attn's
    # xentropy, llm-foundry's default ``fused_crossentropy``; Liger's and quack's fused CE keep the
    # same).  Megatron-Core's own loss is ``kernels="megatron-core"``'s: the two are not combined
    loss_kernel: LossKernel = "eager"
    # the flash-attention kernel the stack runs, priced at its published throughput
    # (costmodels.attention); "profile": the compute profile's fitted attention fractions
    attention_kernel: AttentionKernel = "profile"
    # an FP8 plan's engine: what it keeps of a linear layer's input and weight (costmodels.precision,
    # cost.fp8): Transformer Engine (Megatron, NeMo, Composer amp_fp8) or torchao (torchtitan's float8)
    fp8_engine: Fp8Engine = "transformer-engine"
    # the precision a recomputed linear layer of an FP8 plan reruns its forward and runs its backward
    # in (``sharding.price.outside_fp8_seconds``): "fp8" where the activation checkpoint re-enters the
    # engine's FP8 context (Transformer Engine's and Megatron's checkpoints; torchao's float8 linears
    # are modules, FP8 whatever reruns them); "bf16" where a framework checkpoint reruns Transformer
    # Engine layers outside ``fp8_autocast`` (Composer's torch ``checkpoint_wrapper`` before Apr 2024)
    fp8_recompute: Fp8Recompute = "fp8"
    # the parameters themselves are FP8 (Megatron --fp8-param-gather, TE fp8_model_init): no bf16 weight
    # beside the FP8 copies, and the distributed optimizer gathers 1 byte per parameter
    fp8_params: bool = False
    # the engine overlaps the sequence-parallel all-gathers and reduce-scatters with the GEMMs beside
    # them (Megatron-Core + Transformer Engine userbuffers, --tp-comm-overlap; cost.tp.overlapped)
    tp_comm_overlap: bool = False
    # Zero Bubble's optimizer post-validation (Qi et al. §4, the sail-sg fork's
    # --enable-optimizer-post-validation): each pipeline rank steps its optimizer as soon as its own
    # last backward ends and the global checks (grad norm, inf/nan) are validated afterwards, so
    # steps overlap across ranks and the pipeline costs its steady step (the longest rank span,
    # ``PipelineResult.steady_step_time``) instead of its makespan; off: the optimizer waits for the
    # whole pipeline (Megatron-LM, torchtitan)
    post_validation: bool = False
    # a split backward's engine: False, torch's pipelining (``stage_backward_input`` keeps the
    # autograd graph from B to W, so W frees the saved activations, B only those above every weight
    # op); True, Megatron's WeightGradStore (the sail-sg Zero Bubble fork): B is an ordinary
    # backward that frees every saved activation but the weight ops' inputs, which it stores with
    # their output gradients for W (``ir.OpGraph.wgrad_input_nodes``)
    wgrad_store: bool = False
    params: Params = NOMINAL             # multipliers on the uncertain parameters (cost/params.py)
    # the reference path: every pipeline step simulated event by event, every schedule variant
    # and recompute policy priced (no steady-state extrapolation, no floor, no estimate memo);
    # the same numbers, slower (experiments/bench_search.py --worst times one against the other)
    exact: bool = False

    def __post_init__(self) -> None:
        for name, (what, allowed) in CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise UserError(f"unknown {what} {value!r}", f"use one of: {', '.join(allowed)}")
        if self.fp8_recompute == "bf16" and self.fp8_engine == "torchao":
            raise UserError("FP8 recompute in bf16 needs Transformer Engine: torchao's float8 linears "
                            "recompute in FP8 under any checkpoint",
                            "drop --fp8-recompute bf16, or use --fp8-engine transformer-engine")
        if self.loss_kernel == "fused" and self.kernels == "megatron-core":
            raise UserError("loss kernel 'fused' with kernels 'megatron-core'",
                            "Megatron-Core runs its own vocab-parallel cross entropy (cost.memory."
                            "MEGATRON_LOSS_BYTES): leave the loss kernel 'eager' (--loss-kernel eager)")


CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {   # EstimateOptions field -> (what it names, allowed values)
    "solver": ("ILP solver", BACKENDS),
    "fsdp_grad_sync": ("FSDP gradient sync", GRAD_SYNCS),
    "state_precision": ("state precision", STATE_PRECISION_NAMES),
    "kernels": ("kernels", KERNELS),
    "fp8_engine": ("FP8 engine", FP8_ENGINES),
    "fp8_recompute": ("FP8 recompute precision", FP8_RECOMPUTES),
    "loss_kernel": ("loss kernel", LOSS_KERNELS),
    "attention_kernel": ("attention kernel", ATTENTION_KERNELS),
}


@dataclass(frozen=True)
class LayerWork:
    """Per micro-batch F + B + W + exposed per-layer communication seconds, no recompute: of each
    layer in model order, of the part before the blocks and of the part after them."""

    layers: tuple[float, ...]
    pre: float
    post: float


@dataclass(frozen=True)
class Comm:
    """One collective of one graph per micro-batch, as a per-parallelism pricer returns it."""

    axis: str              # the mesh axis whose group runs it: tp | cp | ep
    kind: str              # all_reduce | reduce_scatter | all_gather | all_to_all | p2p
    nbytes: float          # nccl-tests size argument of one call
    seconds: float         # per micro-batch, all calls
    exposed_s: float       # of which on the critical path
    phase: str             # forward | backward
    calls: int = 1         # calls per micro-batch
    purpose: str = ""      # e.g. "sp" (sequence-parallel gather/scatter), "ulysses", "ring"
    ranks: tuple[int, ...] = ()   # the group it runs on, when not the whole axis (USP's sub-groups)


@dataclass(frozen=True)
class AxisCost:
    """What one parallelism adds to one graph per micro-batch: exposed seconds and its collectives."""

    exposed_fwd_s: float = 0.0
    exposed_bwd_s: float = 0.0
    comms: tuple[Comm, ...] = ()
    compute_fwd_s: float = 0.0     # compute it adds on the compute stream beside its collectives (ring CP's
    compute_bwd_s: float = 0.0     # per-step merges and chunk kernels, cost.cp.ring_step_seconds)


@dataclass(frozen=True)
class Part:
    """Per-micro-batch cost of one graph (a block, or the pre/post part) under a plan.  Equal by
    value and hashed whole, on construction: rank bags (``memory.rank_bag``) key on parts
    thousands of times per plan."""

    forward_s: float
    backward_s: float
    wgrad_s: float
    exposed_fwd_s: float         # communication on the critical path, forward
    exposed_bwd_s: float
    ep_fwd_s: float              # the EP all-to-all part of it (what DualPipeV's pairs can hide)
    ep_bwd_s: float
    saved_bytes: float
    recompute_transient_bytes: float    # re-materialised by recomputation during the layer's backward
    wgrad_held_bytes: float             # input gradients a split backward keeps from B to W (ir.wgrad_held_outputs)
    b_freed_bytes: float                # of saved_bytes, what a split backward frees at B: the loss's, above the head
    dense_numel: int
    expert_numel: int
    largest_param_numel: int     # the biggest single parameter's local elements (a W transient)
    model_flops: float           # per micro-batch (one sequence × mbs), GEMM + attention
    recompute_flops: float
    attention_s: float
    compute_s: float
    comms: tuple[Comm, ...]
    fp8_weight_numel: float = 0.0   # local weight elements its FP8 GEMMs read (cost.fp8; 0 under bf16)
    fp8_gemms: int = 0              # linear layers it runs in FP8 (their amax histories under delayed scaling)
    ilp_gap: float = 0.0         # the relative optimality gap of its tp layout's block ILP

    @property
    def work_s(self) -> float:
        """F + B + W + exposed per-layer communication, one micro-batch."""
        return self.forward_s + self.backward_s + self.wgrad_s + self.exposed_fwd_s + self.exposed_bwd_s

    def __post_init__(self) -> None:
        kept_hash(self)                          # computed now, kept on the part

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    __getstate__ = without_kept_hash

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()


@dataclass(frozen=True)
class DpComm:
    """One data-parallel collective of one pipeline rank per step."""

    kind: str
    nbytes: float
    calls: int
    seconds: float             # all calls
    ranks: tuple[int, ...]
    when: str                  # grad | param (once) | zero3 (every micro-batch) | zero3_step (some passes): ZeRO-2/3;
                               # forward | backward: a collective the FSDP simulation charged (``fsdp.step_exposure``)
    exposed_s: float = 0.0     # of ``seconds``, what the step charges (``dp.dp_exposed`` sets it)


@dataclass(frozen=True)
class Primitive:
    """One class of collective of a plan, on the busiest pipeline rank, per training step."""

    kind: str              # all_reduce | reduce_scatter | all_gather | all_to_all | p2p
    axis: str              # the mesh axis whose group it runs on: tp | cp | ep | dp | pp
    purpose: str           # tp | sp | ulysses | ring | moe | activations | gradients | parameters | embedding
    group_size: int
    span: str              # "NVLink", "IB rail", "IB spine", "across pods (1:7)"
    level: str             # nvlink | rail | spine | pod
    calls_per_step: int
    bytes_per_call: float
    time_s: float
    exposed_s: float

    @property
    def traffic(self) -> str:
        """The class tables and audits group by: the axis, except sequence-parallel gathers/scatters
        (``sp``, on the tp axis), stage-to-stage activations (``pp``, also the receiver's tp
        all-gather of Megatron's scatter/gather) and the tied-embedding all-reduce (``embed``)."""
        return {"sp": "sp", "activations": "pp", "embedding": "embed"}.get(self.purpose, self.axis)


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
    ilp_gap: float = 0.0         # the largest optimality gap of the block ILPs whose layouts the plan uses
    # samples (sequences, images) per second; ``tokens_per_s`` counts positions through the blocks
    # (samples/s × seq for token models, × patches for a ViT); ``throughput_unit`` is the model's own
    samples_per_s: float = 0.0
    throughput_unit: str = "tokens"

    @property
    def throughput(self) -> float:
        """Throughput in the model's own unit: tokens/s for token models, else samples/s."""
        return self.tokens_per_s if self.throughput_unit == "tokens" else self.samples_per_s
    memory_margin_gib: float = 0.0        # head-room ``fits`` leaves: fits ⇔ memory_gib ≤ hbm_gib − margin
    activations_alive: tuple[tuple[int, int], ...] = ()   # worst rank: (virtual stage, micro-batches alive) at its peak

    @property
    def memory_limit_gib(self) -> float:
        """HBM less the margin: the most a fitting plan may use."""
        return self.hbm_gib - self.memory_margin_gib

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["violations"] = [asdict(v) for v in self.violations]
        d["primitives"] = [asdict(p) for p in self.primitives]
        d["stage_times_s"] = [list(t) for t in self.stage_times_s]
        d["memory_per_stage_gib"] = list(self.memory_per_stage_gib)
        d["activations_alive"] = [list(a) for a in self.activations_alive]
        d["memory_limit_gib"] = self.memory_limit_gib
        return d

    def to_json(self) -> str:
        return json.dumps(rounded(self.to_dict()), sort_keys=True)


def rounded(x: Any) -> Any:
    """Floats to 6 significant digits, recursively: stable, readable JSON (shared by every writer)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    return x


@dataclass(frozen=True)
class Boundary:
    """One stage-to-stage boundary activation (``pp.boundary``); all zero without pipelining."""

    bytes_per_rank: float       # what each tp rank sends
    seconds: float              # one send on the slowest hop, the receiver's all-gather included
    hop: tuple[int, ...]        # (sender, receiver) of the slowest hop; () without pipelining
    gather_s: float             # part of ``seconds``: the receiver's all-gather over tp (no SP)


# the simulator's arguments hashed whole (lists as tuples): ``Prices``' memo key
SimulationKey = tuple[str, int, int, int, tuple[float, ...], tuple[float, ...], tuple[float, ...], float,
                      "tuple[float, ...] | None", "tuple[float, ...] | None"]


@dataclass(frozen=True)
class SimulationArgs:
    """What ``Prices.simulate`` simulates for one plan at m micro-batches (``pp.simulation_args``):
    the schedule's shape, per virtual stage F, B, W (and the EP seconds an overlapped DualPipeV
    pair can hide), and the boundary whose seconds are the stage-to-stage P2P time."""

    schedule: str
    pp: int
    m: int
    vpp: int
    f: list[float]
    b: list[float]
    w: list[float]
    f_comm: list[float] | None
    b_comm: list[float] | None
    boundary: Boundary

    @property
    def p2p(self) -> float:
        return self.boundary.seconds

    def key(self, p2p: float | None = None) -> SimulationKey:
        """The simulator's arguments as one hashable key; ``p2p`` in place of the boundary's seconds."""
        return (self.schedule, self.pp, self.m, self.vpp, tuple(self.f), tuple(self.b), tuple(self.w),
                self.boundary.seconds if p2p is None else p2p,
                tuple(self.f_comm) if self.f_comm is not None else None,
                tuple(self.b_comm) if self.b_comm is not None else None)
