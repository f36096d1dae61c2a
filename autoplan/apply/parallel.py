"""``apply``: a Plan run on a real model with torch.distributed.

Composition order on each pipeline stage of this rank (torchtitan's order):
cut the stage → experts sharded over ep (``expert_parallel``) → tensor/sequence parallel
(DTensor) → activation recomputation → FSDP2 (zero 2/3).  Then the pipeline schedule over the
rank's stages; after backward the gradient averages of ``groups.py`` (dense over cp·ep·dp,
experts over cp·dp).

What torch 2.13 cannot run raises ``UserError`` instead of running something else
(see ``check_supported``).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import loss_parallel

from autoplan.apply import (
    context_parallel,
    data_parallel,
    distributed_optimizer,
    expert_parallel,
    pipeline,
    recompute,
    tensor_parallel,
)
from autoplan.apply._torch import flat_mesh, plain_tensors_are_replicated, register_cpu_attention_sharding
from autoplan.apply.device_mesh import device_mesh, expert_device_mesh, torch_mesh_shape
from autoplan.apply.groups import GroupMaker, Reduction, gradient_reductions
from autoplan.apply.layout import ModelLayout, probe
from autoplan.apply.outputs import training_config
from autoplan.apply.tensor_parallel import PlacementsArg
from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.errors import UserError
from autoplan.frontend.hf import unpacked_sequences
from autoplan.mesh import Mesh
from autoplan.plan import SCHEDULE_SPECS, V_SCHEDULES, Plan, recompute_head

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions (computed in fp32)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def vocab_parallel_cross_entropy(tp_mesh: DeviceMesh, vocab: int) -> LossFn:
    """``cross_entropy`` on logits whose vocabulary dim is split over the tp axis, as Megatron
    computes it: each rank holds [.., vocab/tp] and the softmax statistics (max, sum) and the
    target logit are reduced over tp, so the whole [.., vocab] logits never exist on one GPU.
    Logits that arrive whole (the head was not vocab-parallel) take the plain path.  Call it,
    and run its backward, inside DTensor's ``loss_parallel()`` context (not re-entrant, so
    ``ParallelModel.forward_backward`` enters it once around the whole step)."""
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] == vocab:
            return cross_entropy(logits, targets)
        sharded = DTensor.from_local(logits, tp_mesh, (Shard(logits.dim() - 1),), run_check=False)
        # a fresh tensor, not a view of the DTensor's local one: zero-bubble schedules detach
        # the loss in place after its input-gradient pass
        return cross_entropy(sharded, targets).to_local().clone()  # type: ignore[attr-defined]  # a DTensor
    return loss


OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    """Plain SGD, or AdamW without weight decay (per-parameter loop: DTensors of mixed meshes)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)
    raise UserError(f"unknown optimizer {kind!r}", f"use one of: {', '.join(OPTIMIZERS)}")


FP8_CPU_NOTE = ("and a CPU (--backend gloo) has no FP8 tensor cores: an FP8 GEMM there is emulated, and "
                "MXFP8's block-scaled GEMMs need Blackwell's")


def precision_refusal(plan: Plan) -> tuple[str, str]:
    """(problem, fix) of running a low-precision plan with autoplan's runtime: apply builds bf16
    (or fp32) linears only — no Transformer Engine or torchao float8 modules — so an FP8 plan
    would train in another precision than it names; and a CPU has no FP8 tensor cores."""
    return (f"autoplan's runtime runs bf16 plans only: precision={plan.precision} needs FP8 linear layers "
            f"(Transformer Engine or torchao float8), which apply does not build, {FP8_CPU_NOTE}",
            "run or memcheck the plan's bf16 twin (drop precision=" + plan.precision + ") to check its layout, "
            "and export the plan (autoplan export) to train it in FP8 on Hopper or Blackwell GPUs")


def check_supported(plan: Plan, global_batch: int | None = None, seq: int | None = None) -> None:
    """Raise UserError for the parts of a plan this torch cannot run.

    With ``global_batch``, also the micro-batch counts torch's schedules refuse; with ``seq``,
    a sequence that context parallelism cannot cut into 2·cp chunks.
    """
    if plan.precision != "bf16":
        raise UserError(*precision_refusal(plan))
    if plan.folded:
        check_folding(plan)
    if seq is not None and plan.cp > 1:
        # 2·cp chunks; each rank's S/cp tokens split over tp under sp
        per = math.lcm(2 * plan.cp, plan.cp * (plan.tp if plan.sp else 1))
        if seq % per:
            raise UserError(f"cp={plan.cp} cuts the sequence into 2·cp chunks (and sp splits each rank's share "
                            f"over tp): the sequence length {seq} does not divide by {per}",
                            f"use a multiple of {per}")
    if plan.pp == 1:
        return
    refusal = recompute_refusal(plan)
    if refusal:
        raise UserError(refusal, "use recompute none, selective or full on its stages, or a schedule "
                                 "without a split backward (1f1b, interleaved)")
    if plan.schedule not in pipeline.SCHEDULE_CLASSES:
        raise UserError(f"torch.distributed.pipelining has no {plan.schedule} schedule",
                        "use one of: " + ", ".join(pipeline.SCHEDULE_CLASSES))
    if global_batch is None:
        return
    m = plan.microbatches(global_batch)
    stages = plan.pp * plan.vpp
    if plan.schedule == "1f1b" and m < stages:
        raise UserError(f"torch's Schedule1F1B needs at least as many micro-batches as stages: "
                        f"{m} micro-batches, {stages} stages",
                        "use schedule=gpipe (the same order when m < pp), or raise the global batch")
    if plan.schedule == "dualpipev" and m < stages:
        raise UserError(f"torch's DualPipeV needs at least as many micro-batches as stages: "
                        f"{m} micro-batches, {stages} stages", "raise the global batch or lower mbs")
    rounds = max(1, m // plan.pp)
    if plan.schedule in ("interleaved", "zb-h1") and m % rounds:
        raise UserError(f"torch's {pipeline.SCHEDULE_CLASSES[plan.schedule].__name__} needs the "
                        f"micro-batches ({m}) to be a multiple of max(1, micro-batches // pp) = {rounds}",
                        "pick a global batch giving a multiple of pp micro-batches")


def check_folding(plan: Plan) -> None:
    """Raise UserError for the MoE parallel folding this runtime does not build: the experts run
    whole on each rank of the expert layout's ep group (etp = 1), or split over tp exactly as the
    attention is (etp = tp with the same tp groups in both layouts); Megatron-Core also runs
    1 < etp ≠ tp, which needs expert weights on a third tp mesh."""
    mesh = Mesh.of(plan)
    if plan.zero >= 2 and plan.dp > 1 and (plan.cp * plan.dp) % plan.edp:
        raise UserError(f"FSDP2 averages expert gradients over edp={plan.edp} ranks, more than the cp·dp = "
                        f"{plan.cp * plan.dp} data ranks whose average they are (tp > etp·ep)",
                        "use zero=0 or 1, or etp·ep ≥ tp")
    if plan.etp == 1:
        return
    if plan.etp != plan.tp or mesh.expert is None or mesh.expert.groups("tp") != mesh.groups("tp"):
        raise UserError(f"autoplan's runtime folds experts with etp=1 or etp=tp over the attention's tp "
                        f"groups; etp={plan.etp} with tp={plan.tp} (order={'-'.join(plan.order)}) is neither",
                        "run it with etp=1 or etp=tp (tp innermost), or export it to Megatron-LM (--to megatron)")


def recompute_refusal(plan: Plan) -> str | None:
    """Why torch cannot run ``plan``'s recompute under its schedule, or None: torch's selective
    activation checkpoint (``recompute=op``) refuses a region's second backward pass ("Trying to
    backward an extra time", torch 2.13), which a split backward's W is."""
    stages = plan.pp * plan.vpp
    if SCHEDULE_SPECS[plan.schedule].split_backward and any(recompute_head(plan.recompute_of_stage(s)) == "op"
                                                             for s in range(stages)):
        return (f"schedule={plan.schedule} splits the backward into B and W, and torch's selective "
                f"activation checkpoint (recompute=op) refuses the second pass over a region")
    return None


@dataclass(frozen=True)
class StepGroups:
    """The process groups a training step of this rank reduces over (``_step_groups`` makes them)."""

    tied: object | None                       # the first and last pipeline rank holding a tied weight
    dense_dp: object | None                   # the data group: cp·ep·dp ranks (DENSE_DP)
    dense_dp_ranks: tuple[int, ...]
    expert_dp: object | None                  # EXPERT_DP: the ranks holding the same experts
    expert_dp_ranks: tuple[int, ...]
    ep: object | None
    reductions: tuple[Reduction, Reduction]   # gradient averages: dense, expert (``groups.py``)


@dataclass
class ParallelModel:
    """This rank's share of the model under a plan, and how to run a training step on it.

    ``stages`` are this rank's pipeline stages (``StageModule``; one unless the
    schedule is interleaved or V-shaped); ``schedule`` is the torch pipelining
    schedule (None when pp = 1).  ``build`` makes it (``apply`` calls it) and alone sets the
    private state: the process groups of a step and Megatron's fp32 gradient buffers.
    """

    plan: Plan
    mesh: DeviceMesh
    layout: ModelLayout
    stages: list[pipeline.StageModule]
    schedule: object | None
    loss_fn: LossFn
    microbatches: int
    coords: dict[str, int]
    _groups: StepGroups = field(repr=False)
    tied: tuple[str, ...] = ()
    vocab_parallel_loss: bool = False       # the last stage keeps logits split over tp
                                            # (see vocab_parallel_cross_entropy)
    cp_groups: context_parallel.CPGroups | None = None
    expert_names: frozenset[str] = frozenset()   # parameters sharded over ep (empty when ep = 1)
    # zero 0/1 under mixed precision: Megatron's fp32 gradient buffers (dense, expert; None: no such parameters)
    _main_grads: tuple[distributed_optimizer.MainGrads | None, ...] = field(default=(), repr=False)

    @classmethod
    def build(cls, ctx: ApplyContext, stages: list[pipeline.StageModule], global_batch: int) -> ParallelModel:
        """This rank's parallelised ``stages`` with their pipeline schedule, the process groups of a
        step (``_step_groups``: collective) and, under Megatron's engine, the fp32 gradient buffers."""
        plan = ctx.plan
        microbatches = plan.microbatches(global_batch)
        schedule = None
        if plan.pp > 1:
            schedule = pipeline.build_schedule(plan, stages, ctx.mesh["pp"].get_group(), ctx.device, microbatches,
                                               ctx.loss_fn)
        tied = tuple(sorted(ctx.layout.pre & ctx.layout.post))
        groups = _step_groups(ctx, tied)
        main_grads: tuple[distributed_optimizer.MainGrads | None, ...] = ()
        if ctx.megatron:
            split = _dense_and_expert(_unique_parameters(stages), ctx.expert_names)
            main_grads = tuple(distributed_optimizer.MainGrads(ps) if ps else None for ps in split)
        return cls(plan=plan, mesh=ctx.mesh, layout=ctx.layout, stages=stages, schedule=schedule,
                   loss_fn=ctx.loss_fn, microbatches=microbatches, coords=ctx.coords, tied=tied,
                   vocab_parallel_loss=ctx.vocab_parallel, cp_groups=ctx.cp_groups,
                   expert_names=ctx.expert_names, _groups=groups, _main_grads=main_grads)

    @property
    def gradient_buffers(self) -> tuple[distributed_optimizer.MainGrads, ...]:
        """Megatron's fp32 gradient buffers of this rank (zero 0/1 under mixed precision; else none)."""
        return tuple(g for g in self._main_grads if g is not None)

    # --- where this rank sits -------------------------------------------------
    @property
    def has_first_stage(self) -> bool:
        return any(s.first for s in self.stages)

    @property
    def has_last_stage(self) -> bool:
        return any(s.last for s in self.stages)

    @property
    def reports_loss(self) -> bool:
        """The one rank that prints the loss: last stage, first rank of every other axis."""
        return self.has_last_stage and all(c == 0 for a, c in self.coords.items() if a != "pp")

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(model FQN, parameter) of every parameter on this rank, each once."""
        return _unique_parameters(self.stages)

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    # --- data -------------------------------------------------------------------
    def local_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch [B, S] (split over the dp axis) and, under context
        parallelism, its two sequence chunks (``context_parallel.split_sequence``)."""
        n = batch.shape[0] // self.plan.dp
        ep = Mesh.of(self.plan).size("ep")        # 1 when folded: the attention layout has no ep axis
        i = self.coords["dp"] * ep + self.coords["ep"]
        rows = batch[i * n:(i + 1) * n]
        return rows if self.plan.cp == 1 else context_parallel.split_sequence(rows, self.plan.cp, self.coords["cp"])

    # --- a training step ---------------------------------------------------------
    def _context(self):
        stack = contextlib.ExitStack()
        if self.plan.tp > 1:
            stack.enter_context(plain_tensors_are_replicated())
        if self.vocab_parallel_loss:
            stack.enter_context(loss_parallel())
        if self.cp_groups is not None:
            stack.enter_context(unpacked_sequences())      # positions of a chunk pair are not a packed batch
            stack.enter_context(context_parallel.ContextParallelAttention(self.cp_groups, self.mesh["cp"]))
        if self.gradient_buffers:
            stack.enter_context(distributed_optimizer.split_weight_gradients_folded(list(self.gradient_buffers)))
        return stack

    def forward_backward(self, ids: torch.Tensor, targets: torch.Tensor, *, read_loss: bool = True,
                         before_microbatch=None) -> float | None:
        """Forward and backward of this rank's local batch [B/dp, seq]; gradients end synced.

        Returns the mean loss over the local micro-batches on ranks that hold the
        last stage, else None.  Gradients equal those of the loss averaged over the
        global batch.  ``read_loss=False`` never reads a value back (fake tensors: memcheck);
        ``before_microbatch()`` runs before each micro-batch of a pp = 1 step (memcheck's tracker reset).
        """
        with self._context():
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                args = (ids,) if self.has_first_stage else ()
                kwargs = {"target": targets, "losses": losses} if self.has_last_stage else {}
                self.schedule.step(*args, **kwargs)  # type: ignore[attr-defined]  # a torch pipeline schedule
                loss = torch.stack(losses).mean().item() if self.has_last_stage and read_loss else None
            else:
                stage, total = self.stages[0], 0.0
                for mb_ids, mb_targets in zip(ids.chunk(self.microbatches), targets.chunk(self.microbatches)):
                    if before_microbatch is not None:
                        before_microbatch()
                    mb_loss = self.loss_fn(stage(mb_ids), mb_targets)
                    (mb_loss / self.microbatches).backward()
                    total += mb_loss.item() if read_loss else 0.0
                loss = total / self.microbatches if read_loss else None
            self._finish_gradients()
        return loss

    def _split(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(dense, expert) parameters of this rank."""
        return _dense_and_expert(self.named_parameters(), self.expert_names)

    def _finish_gradients(self) -> None:
        """tp partial sums settled, then the dense and expert averages of ``groups.py``, then tied sums."""
        data_parallel.settle_tp_gradients(self.parameters())
        if self._main_grads:
            # the schedule's 1/m scaling (scale_grads) reads .grad, which the buffer's hooks free
            extra = self.microbatches if self.schedule is not None else 1
            for grads, reduction in zip(self._main_grads, self._groups.reductions):
                if grads is not None:
                    grads.average(reduction.group, reduction.divisor * extra)
        else:
            for params, reduction in zip(self._split(), self._groups.reductions):
                data_parallel.reduce_gradients(params, reduction.group, reduction.divisor)
        self._sum_tied_gradients()

    def _sum_tied_gradients(self) -> None:
        """A weight shared by the first and last stage (tied embedding/head) gets the sum of both."""
        if not self.tied or self.plan.pp == 1:
            return
        holders = [s for s in self.stages if s.first or s.last]
        for name in self.tied:
            grads = [data_parallel.grad_of(s.model.get_parameter(name)) for s in holders]
            if len(grads) == 2:                       # V placement: both stages on this rank
                grads[0].add_(grads[1])  # type: ignore[union-attr,arg-type]  # a tied weight has its gradient
                grads[1].copy_(grads[0])  # type: ignore[union-attr,arg-type]
            elif grads:
                dist.all_reduce(grads[0], group=self._groups.tied)

    def global_loss(self, loss: float) -> float:
        """Average of a last-stage rank's loss over the dp and cp axes (call on last-stage ranks only)."""
        if len(self._groups.dense_dp_ranks) == 1:
            return loss
        t = torch.tensor([loss], dtype=torch.float64, device=self._device())
        dist.all_reduce(t, group=self._groups.dense_dp)
        return t.item() / len(self._groups.dense_dp_ranks)

    def _device(self) -> torch.device:
        return next(iter(self.stages[0].parameters()), torch.empty(0)).device

    # --- optimizer ------------------------------------------------------------------
    def optimizer(self, kind: str = "adamw", lr: float = 1e-3):
        """SGD or AdamW over this rank's parameters; ZeRO-1 sharded when the plan says zero=1
        (under mixed precision: Megatron's distributed optimizer over the fp32 gradient buffers)."""
        if self._main_grads:
            return self._distributed_optimizer(kind, lr)
        if self.plan.zero != 1 or len(self._groups.dense_dp_ranks) == 1:
            return make_optimizer(kind, self.parameters(), lr)
        dense, experts = self._split()
        parts = []
        # expert shards differ across ep: each is sharded over its own replicas (EXPERT_DP)
        for params, group, ranks in ((dense, self._groups.dense_dp, self._groups.dense_dp_ranks),
                                     (experts, self._groups.expert_dp, self._groups.expert_dp_ranks)):
            if not params:
                continue
            parts.append(data_parallel.ZeroOneOptimizer(params, lambda ps: make_optimizer(kind, ps, lr), group, ranks)
                         if len(ranks) > 1 else make_optimizer(kind, params, lr))
        return parts[0] if len(parts) == 1 else data_parallel.Optimizers(parts)

    def _distributed_optimizer(self, kind: str, lr: float):
        """``distributed_optimizer.DistributedOptimizer`` per gradient buffer, sharded over its
        reduction's ranks under zero=1, whole under zero=0."""
        parts = []
        for grads, reduction in zip(self._main_grads, self._groups.reductions):
            if grads is not None:
                ranks = reduction.ranks if self.plan.zero == 1 else (dist.get_rank(),)
                parts.append(distributed_optimizer.DistributedOptimizer(
                    grads, lambda ps: make_optimizer(kind, ps, lr), reduction.group, ranks))
        return parts[0] if len(parts) == 1 else data_parallel.Optimizers(parts)

    # --- inspection (collectives: call on every rank) ------------------------------------
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """FQN → the whole gradient (gathered over tp and FSDP shards, and over ep for experts)
        of this rank's parameters."""
        out = {}
        for name, p in self.named_parameters():
            g = p.grad
            if g is None:
                continue
            full = (g.full_tensor() if isinstance(g, DTensor) else g).detach().contiguous()
            if name in self.expert_names:
                parts = [torch.empty_like(full) for _ in range(self.plan.ep)]
                dist.all_gather(parts, full, group=self._groups.ep)
                full = torch.cat(parts)
            out[name] = full.clone()
        return out


def apply(model: nn.Module, plan: Plan, mesh: DeviceMesh | None = None, *, global_batch: int, seq: int,
          placements: PlacementsArg = None, loss_fn: LossFn = cross_entropy,
          mixed_precision: bool = False) -> ParallelModel:
    """Shard ``model`` (materialised, identical on every rank) for ``plan`` on this rank.

    ``model`` maps token ids [batch, seq] to logits [batch, seq, vocab].
    ``placements``: tp placement per parameter name within a block ("R", "S(0)",
    "S(1)", ...), or a callable (block index, block) → such a mapping; None derives
    Megatron's placements from the module graph (see ``layout.py``).
    ``global_batch`` sequences of length ``seq`` per step; ``plan.mbs`` per micro-batch.
    With tp > 1 and the default loss, vocabulary-parallel logits stay split over tp and the
    loss is computed on the shards (``vocab_parallel_cross_entropy``); a custom ``loss_fn``
    gets whole logits.  ``mixed_precision``: FSDP (zero ≥ 2) keeps fp32 sharded parameters and
    computes in bf16 (torchtitan's policy); zero 0/1 runs Megatron-Core's engine (bf16 parameters,
    fp32 gradient buffers, the distributed optimizer: ``distributed_optimizer``).  ``autoplan
    memcheck`` runs both.
    """
    check_supported(plan, global_batch, seq)
    training_config(model)
    ctx = _apply_context(model, plan, mesh, global_batch=global_batch, seq=seq, placements=placements,
                         loss_fn=loss_fn, mixed_precision=mixed_precision)
    bounds = pipeline.stage_bounds(plan, ctx.layout.num_blocks)
    stages = [_parallelize_stage(model, sid, bounds, ctx) for sid in plan.stages_of_rank(ctx.coords["pp"])]
    return ParallelModel.build(ctx, stages, global_batch)


@dataclass(frozen=True)
class ApplyContext:
    """What ``apply`` finds once for this rank, read by every stage step and ``ParallelModel.build``."""

    plan: Plan
    mesh: DeviceMesh
    layout: ModelLayout
    seq: int
    device: torch.device
    rank: int
    coords: dict[str, int]
    groups: GroupMaker
    ep_group: object | None                   # None when ep = 1
    ep_rank: int                              # this rank's place in it (its expert share)
    expert_mesh: DeviceMesh | None            # a folded plan's expert layout (``expert_device_mesh``)
    expert_names: frozenset[str]              # parameters sharded over ep
    tp_mesh: DeviceMesh | None                # None when tp = 1
    placements: dict[str, str]                # tp placement of every parameter (empty when tp = 1)
    stream: tuple[Placement, ...]             # the residual stream between stages: Shard(1) under sp
    loss_fn: LossFn
    vocab_parallel: bool                      # the last stage keeps logits split over tp
    cp_groups: context_parallel.CPGroups | None
    positions: torch.Tensor | None            # this cp rank's token positions (None when cp = 1)
    mixed_precision: bool

    @property
    def fsdp(self) -> bool:
        """FSDP2 shards the stages (zero 2/3 with dp > 1)."""
        return self.plan.dp > 1 and self.plan.zero >= 2

    @property
    def plain_experts(self) -> bool:
        """Folded with etp = 1: the experts run whole on plain tensors, not split over tp."""
        return self.plan.folded and self.plan.expert_tp == 1

    @property
    def megatron(self) -> bool:
        """Megatron's engine (zero 0/1 under mixed precision): bf16 stages, fp32 gradient buffers."""
        return self.mixed_precision and self.plan.zero <= 1


def _apply_context(model: nn.Module, plan: Plan, mesh: DeviceMesh | None, *, global_batch: int, seq: int,
                   placements: PlacementsArg, loss_fn: LossFn, mixed_precision: bool) -> ApplyContext:
    """The checked mesh, the probed layout, and this rank's coordinates, groups and placements."""
    mesh = _checked_mesh(model, plan, mesh)
    device = next(model.parameters()).device
    layout = _validated_layout(model, plan, global_batch=global_batch, seq=seq, device=device)
    rank = dist.get_rank()
    coords = Mesh.of(plan).coords(rank)
    expert_mesh = expert_device_mesh(plan, device.type)
    groups = GroupMaker(plan, mesh, rank, expert_mesh)
    ep_group = groups.named("ep")[0] if plan.ep > 1 else None
    ep_rank = Mesh.of(plan).for_group("ep").coords(rank)["ep"]
    expert_names = expert_parallel.expert_parameter_names(model, layout.blocks_path) if ep_group else frozenset()
    tp_mesh = mesh["tp"] if plan.tp > 1 else None
    resolved = _tp_placements(model, layout, plan, tp_mesh, placements)
    vocab_parallel = tp_mesh is not None and loss_fn is cross_entropy and layout.vocab > 0
    if vocab_parallel:
        loss_fn = vocab_parallel_cross_entropy(tp_mesh, layout.vocab)  # type: ignore[arg-type]  # vocab_parallel: a mesh
    cp_groups = _cp_groups(model, plan, rank)
    positions = context_parallel.local_positions(seq, plan.cp, coords["cp"], device) if cp_groups else None
    return ApplyContext(plan=plan, mesh=mesh, layout=layout, seq=seq, device=device, rank=rank, coords=coords,
                        groups=groups, ep_group=ep_group, ep_rank=ep_rank, expert_mesh=expert_mesh,
                        expert_names=expert_names, tp_mesh=tp_mesh,
                        placements=resolved, stream=(Shard(1),) if plan.sp else (Replicate(),),
                        loss_fn=loss_fn, vocab_parallel=vocab_parallel, cp_groups=cp_groups,
                        positions=positions, mixed_precision=mixed_precision)


def _checked_mesh(model: nn.Module, plan: Plan, mesh: DeviceMesh | None) -> DeviceMesh:
    """The given mesh, checked against the plan, or the plan's mesh on the model's device type."""
    if not dist.is_initialized():
        raise UserError("apply needs an initialised process group",
                        "call torch.distributed.init_process_group first (autoplan run does)")
    device_type = next(model.parameters()).device.type
    mesh = mesh if mesh is not None else device_mesh(plan, device_type)
    _check_mesh(mesh, plan)
    return mesh


def _validated_layout(model: nn.Module, plan: Plan, *, global_batch: int, seq: int,
                      device: torch.device) -> ModelLayout:
    """The model's layout (``probe``) and the plan validated against its blocks and experts."""
    layout = probe(model, torch.zeros(plan.mbs, seq, dtype=torch.long, device=device))
    plan.validate(num_gpus=dist.get_world_size(), num_layers=layout.num_blocks, heads=0, seq=seq,
                  global_batch=global_batch, experts=expert_parallel.model_experts(model, layout.blocks_path))
    return layout


def _tp_placements(model: nn.Module, layout: ModelLayout, plan: Plan, tp_mesh: DeviceMesh | None,
                   placements: PlacementsArg) -> dict[str, str]:
    """Every parameter's tp placement (``tensor_parallel.resolve_placements``); none without tp."""
    if tp_mesh is None:
        return {}
    register_cpu_attention_sharding()
    return tensor_parallel.resolve_placements(model, layout, plan.tp, placements, plan.ep)


def _cp_groups(model: nn.Module, plan: Plan, rank: int) -> context_parallel.CPGroups | None:
    """This rank's context-parallel exchange groups (collective), None when cp = 1."""
    if plan.cp == 1:
        return None
    context_parallel.check_model(model)
    return context_parallel.build_groups(plan, rank)


def _parallelize_stage(model: nn.Module, sid: int, bounds: list[tuple[int, int]],
                       ctx: ApplyContext) -> pipeline.StageModule:
    """Virtual stage ``sid`` cut from ``model`` and parallelised in torchtitan's order
    (``parallelize_llama``): cp routing, experts over ep, tp, recompute, then FSDP (or, under
    Megatron's engine, bf16 parameters)."""
    first, end = bounds[sid]
    last = sid == len(bounds) - 1
    copy, inject = pipeline.cut_stage(model, ctx.layout, first, end, owns_pre=sid == 0, owns_post=last,
                                      stub_dtype=torch.bfloat16 if ctx.megatron else None)
    _apply_cp(copy, ctx)
    _apply_ep(copy, ctx)
    _apply_tp(copy, ctx)
    stage = pipeline.StageModule(copy, inject, index=sid, first=sid == 0, last=last, seq=ctx.seq // ctx.plan.cp,
                                 tp_mesh=ctx.tp_mesh, stream=ctx.stream, keep_vocab_shard=ctx.vocab_parallel,
                                 positions=ctx.positions)
    blocks = stage.stage_blocks(ctx.layout)
    _apply_ac(blocks, ctx)
    if ctx.fsdp:
        _apply_fsdp(stage, blocks, ctx)
    elif ctx.megatron:
        distributed_optimizer.to_bf16(stage)
    return stage


def _apply_cp(module: nn.Module, ctx: ApplyContext) -> None:
    """Under cp, every capacity-routed MoE queues the whole sequence's tokens, as in one process."""
    if ctx.cp_groups is not None:
        context_parallel.route_whole_sequence(module, ctx.plan.cp, ctx.coords["cp"], ctx.mesh["cp"].get_group(),
                                              ctx.seq)


def _apply_ep(module: nn.Module, ctx: ApplyContext) -> None:
    """Under ep, each experts module keeps this ep rank's experts (``expert_parallel``)."""
    if ctx.ep_group is not None:
        expert_parallel.shard_model_experts(module, ctx.layout.blocks_path, ctx.plan.ep, ctx.ep_rank,
                                            ctx.ep_group, plain=ctx.plain_experts)


def _apply_tp(module: nn.Module, ctx: ApplyContext) -> None:
    """Under tp, parameters become DTensors with their resolved placements (``tensor_parallel``)."""
    if ctx.tp_mesh is not None:
        skip = frozenset(expert_parallel.find_experts(module, ctx.layout.blocks_path)) if ctx.plain_experts \
            else frozenset()
        tensor_parallel.shard_module_tree(module, ctx.layout, ctx.placements, ctx.tp_mesh, ctx.plan.sp, skip)


def _apply_ac(blocks: list[nn.Module], ctx: ApplyContext) -> None:
    """Activation recomputation of the plan's policy for this pipeline rank (``recompute``)."""
    recompute.recompute_blocks(blocks, ctx.plan.recompute_of_stage(ctx.coords["pp"]))


def _apply_fsdp(stage: pipeline.StageModule, blocks: list[nn.Module], ctx: ApplyContext) -> None:
    """FSDP2 over dp; under ep the dense parameters over every rank of ep·dp and each experts
    module over dp (= dp/ep), as torchtitan shards them; folded, each experts module over the
    expert layout's edp axis."""
    if ctx.ep_group is None:
        data_parallel.shard_fsdp(stage, blocks, ctx.mesh["dp"], ctx.plan.zero, ctx.mixed_precision)
        return
    experts = [stage.model.get_submodule(n) for n in expert_parallel.find_experts(stage.model, ctx.layout.blocks_path)]
    data_parallel.shard_fsdp(stage, blocks, flat_mesh(ctx.mesh, ("ep", "dp")), ctx.plan.zero, ctx.mixed_precision,
                             experts=experts, expert_mesh=(ctx.expert_mesh or ctx.mesh)["dp"])


def _step_groups(ctx: ApplyContext, tied: tuple[str, ...]) -> StepGroups:
    """The groups of a step; ``new_group`` is collective, so every rank makes them in this order."""
    plan = ctx.plan
    tied_group = _tied_group(plan, ctx.rank) if tied and plan.pp > 1 else None
    dense_dp, dense_dp_ranks = ctx.groups.named(DENSE_DP)
    expert_dp, expert_dp_ranks = ctx.groups.named(EXPERT_DP)
    return StepGroups(tied=tied_group, dense_dp=dense_dp, dense_dp_ranks=dense_dp_ranks, expert_dp=expert_dp,
                      expert_dp_ranks=expert_dp_ranks, ep=ctx.ep_group,
                      reductions=gradient_reductions(plan, ctx.groups, fsdp=ctx.fsdp))


def _unique_parameters(stages: list[pipeline.StageModule]) -> list[tuple[str, nn.Parameter]]:
    """(model FQN, parameter) of every parameter of ``stages``, each once."""
    out, seen = [], set()
    for stage in stages:
        for name, p in stage.model.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
    return out


def _dense_and_expert(named: list[tuple[str, nn.Parameter]],
                      expert_names: frozenset[str]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(dense, expert) parameters of ``named``."""
    return ([p for n, p in named if n not in expert_names], [p for n, p in named if n in expert_names])


def _check_mesh(mesh: DeviceMesh, plan: Plan) -> None:
    """A given mesh must lay ranks out as ``device_mesh(plan)`` does."""
    names, shape = torch_mesh_shape(plan)
    if (tuple(mesh.mesh_dim_names or ()) != names or tuple(mesh.shape) != shape
            or mesh.mesh.flatten().tolist() != list(range(plan.num_gpus))):
        raise UserError(f"the DeviceMesh {tuple(mesh.mesh_dim_names or ())} {tuple(mesh.shape)} does not lay "
                        f"ranks out as the plan: axes {names} of sizes {shape} over ranks 0..{plan.num_gpus - 1}",
                        "build it with autoplan.apply.device_mesh(plan) or pass mesh=None")


def _tied_group(plan: Plan, rank: int):
    """Process group of the first and last pipeline rank holding ``rank``'s tied weight copies.

    Every rank creates every group (``new_group`` is collective); V placement keeps
    both stages on pipeline rank 0, so no group is needed there.
    """
    if plan.schedule in V_SCHEDULES:
        return None
    mine = None
    for group in Mesh.of(plan).groups("pp"):
        pg = dist.new_group([group[0], group[-1]])
        if rank in (group[0], group[-1]):
            mine = pg
    return mine
