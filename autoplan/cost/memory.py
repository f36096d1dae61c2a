"""Memory per GPU of one pipeline rank: model states, activations in flight, transients; the margin.

=============  ==========================================================================
category       bytes (peak allocated by the framework, per GPU)
=============  ==========================================================================
params, grads, ``costmodels.memory.model_state_bytes`` of the rank's dense parameters over
optimizer      the dense dp group and its expert parameters over the expert dp group, by ZeRO
               stage and engine (Megatron's distributed optimizer for zero 0/1, FSDP2 for 2/3);
               under an FP8 precision ``params`` adds the engine's FP8 weight copies and
               delayed-scaling amax histories (``fp8_state_bytes``)
activations    the peak over the rank's own schedule order of the saved bytes of the
               (micro-batch, virtual stage) forwards alive (``costmodels.pipeline.live``: each
               chunk weighed by its own layers, not a mean), plus on the last stage the loss
               buffers beyond the saved log-softmax: ``b·(s/cp)·V/tp·8`` (the fp32 gradient
               of the NLL and of the log-softmax, alive together at the loss backward; under a
               fused loss kernel, ``cost.loss``, the logits' bf16 gradient, ``·2``); under
               a split backward a chunk also holds from B to W the gradient into each weight
               op (``Part.wgrad_held_bytes``), B frees the loss's saved bytes
               (``Part.b_freed_bytes``), and the first stage holds none (torch skips its B);
               there the loss buffers are a moment of the walk (``splits_backward``): the start of
               the last stage's B, before its held gradients exist, not B's end
other          transients of one layer's backward: the recompute transient of the rank's
               biggest recomputed layer (``Part.recompute_transient_bytes``, what recomputing
               re-materialises) plus FSDP staging (``fsdp_staging_bytes``, following the runtime's
               prefetch depth and reshard-after-forward, ``fsdp.Policy``), and under a split
               backward with the zero 0/1 engine one parameter's bf16 gradient before its fold
               into main_grad (``split_wgrad_bytes``); on the last stage
               the loss backward and a layer's backward are two moments, so only what the
               transients exceed the loss buffers by is added: peak = live + max(loss, transients)
               (where the walk prices the loss, the transients are added whole)
=============  ==========================================================================

Under FSDP (zero ≥ 2) the gradients are freed by ``zero_grad`` (set to None) and rebuilt in
backward: with one micro-batch per step none exists yet at the peak (the loss backward, or the
first layer's), so ``grads`` is 0 then; with more, the earlier micro-batches' shards are there.
Under pipeline parallelism gradients are reduced once, at the last backward (the schedule's
no-sync), so the rank's unsharded gradients accumulate as well, in the reduce dtype fp32
(``UNSHARDED_GRAD_BYTES`` = 4: FSDP2's ``FSDPParam.to_accumulated_grad_if_needed`` upcasts the
bf16 gradient to ``reduce_dtype`` before accumulating, torch 2.13
``distributed/fsdp/_fully_shard/_fsdp_param.py``; Llama 3 §3.3.2 likewise: "FP32 gradient
accumulation during backward computation over multiple micro-batches").

The zero 0/1 engine's state dtypes are ``EstimateOptions.state_precision``
(``costmodels.memory.STATE_PRECISIONS``: Megatron-Core's bf16/fp32 by default).
Checked against torch's ``MemTracker`` on the applied plan by ``autoplan memcheck``.

``DEFAULT_MARGIN_GIB`` is what a run loses outside these: the CUDA context and library
workspaces (outside PyTorch's caching allocator), NCCL's communicator buffers
(``NCCL_BUFFSIZE`` = 4 MiB per channel per peer, up to 32 channels per communicator, one
communicator per tp/cp/ep/dp/pp group) and the caching allocator's fragmentation (reserved −
allocated; ``autoplan memcheck --allocator`` replays it: 6.5 GiB of holes in the default stream
and 6.4 cached in FSDP2's all-gather and reduce-scatter pools at torchtitan's llama3-8b FSDP8
peak, none of it needed, since a full device frees cached blocks before it fails).  A plan
*fits* when its peak is at most HBM − margin (``usable_bytes``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

from autoplan.cost.fsdp import Policy
from autoplan.cost.pp import Bag, Pipeline, per_bag
from autoplan.cost.types import DEFAULT_MARGIN_GIB, Part  # noqa: F401  (DEFAULT_MARGIN_GIB: documented here)
from autoplan.errors import UserError
from autoplan.plan import SCHEDULE_SPECS, Plan
from costmodels.memory import (
    GIB,
    MASTER_BYTES,
    PARAM_BYTES,
    STATE_PRECISIONS,
    StatePrecision,
    keeps_gathered,
    model_state_bytes,
)
from costmodels.pipeline.live import LivePeak
from costmodels.precision import amax_history_bytes, weight_copy_bytes

# The loss backward's extra buffers per logit element beyond the saved fp32 log-softmax output:
# the NLL gradient and the log-softmax gradient, both fp32 (F.cross_entropy on fp32 logits).
LOSS_GRAD_BYTES = 4 * 2
# The same under tp > 1, vocabulary-parallel through DTensor's ``loss_parallel`` (apply's
# ``vocab_parallel_cross_entropy``): its NLL backward builds the gradient as a zeroed fp32 shard
# plus the masked update, one fp32 [b·s, V/tp] buffer more (MemTracker, torch 2.13: 3·4 bytes per
# local logit at tp = 2 and 8, against 2·4 for plain F.cross_entropy at tp = 1).
VOCAB_PARALLEL_LOSS_GRAD_BYTES = 4 * 3
# Megatron-Core's loss (``kernels=megatron-core``): ``vocab_parallel_cross_entropy(logits.float())``
# (megatron/core/tensor_parallel/cross_entropy.py and language_module.py at 2196398, Apr 2024) keeps
# one fp32 buffer, the softmax computed in place in the max-subtracted copy of the fp32 logits (the
# saved bytes), and its backward turns that buffer into the gradient in place; beyond it, the
# forward holds the bf16 logits and their fp32 copy while it subtracts the max (2 + 4 bytes per
# local logit), the backward only the bf16 gradient of ``.float()`` (2): the larger moment counts,
# at every tp.
MEGATRON_LOSS_BYTES = 2 + 4
# FSDP staging per parameter of one unit: its bf16 unsharded gradient and the fp32 copy the
# reduce-scatter reads (FSDP2 reduce_dtype fp32).
GRAD_STAGING_BYTES = PARAM_BYTES + MASTER_BYTES
UNSHARDED_GRAD_BYTES = MASTER_BYTES   # fp32 (reduce dtype) gradients accumulated unsharded under no-sync


@dataclass(frozen=True)
class RankMemory:
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    dense_numel: float
    expert_numel: float
    alive: tuple[tuple[int, int], ...] = ()     # (virtual stage, micro-batches alive) at the peak

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def breakdown(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other}


def usable_bytes(hbm_bytes: float, margin_gib: float) -> float:
    """What a plan may use: HBM less the margin."""
    return hbm_bytes - margin_gib * GIB


def loss_bytes(plan: Plan, seq_len: int, vocab: int, kernels: str = "eager",
               fused_grad_bytes: float | None = None) -> float:
    """The last stage's loss buffers beyond its saved bytes: ``b·(s/cp)·V/tp·LOSS_GRAD_BYTES``
    (``VOCAB_PARALLEL_LOSS_GRAD_BYTES`` when tp > 1; ``MEGATRON_LOSS_BYTES`` on Megatron-Core's
    kernels; under a fused loss kernel, ``cost.loss``, the gradient of the logits its backward
    writes, ``fused_grad_bytes`` per local logit at every tp: 2 for bf16 logits)."""
    per_logit: float
    if kernels == "megatron-core":
        per_logit = MEGATRON_LOSS_BYTES
    elif fused_grad_bytes is not None:
        per_logit = fused_grad_bytes
    else:
        per_logit = VOCAB_PARALLEL_LOSS_GRAD_BYTES if plan.tp > 1 else LOSS_GRAD_BYTES
    return plan.mbs * seq_len / plan.cp * vocab / plan.tp * per_logit


def fsdp_staging_bytes(plan: Plan, block: float, root: float, pol: Policy, freed: float = 0.0) -> float:
    """FSDP's transient buffers at the peak, for the rank's biggest block of ``block`` parameters,
    whose saved activations per micro-batch are ``freed`` bytes, and its ``root`` parameters
    (embedding, final norm, head: the stage's own FSDP unit).  Two moments of the block's
    backward (FSDP2's ``FSDPParamGroup.post_backward``, torch 2.13), the larger counts:

    * *during* it, its activations still alive: the gathered bf16 parameters of 1 + prefetch
      blocks (the one computing and those prefetched; FSDP2 prefetches one) and the root's, which
      FSDP2 keeps gathered from forward to backward — zero 3 resharding after forward
      (torchtitan's default without pp) — and under no-sync (pp > 1: one reduce-scatter per step,
      after the last backward) the block's fresh bf16 gradient before it is added to the fp32
      accumulator, ``PARAM_BYTES · block``;
    * *after* it, under a reduce-scatter every micro-batch: the block's activations are freed
      (``freed``) and the block is resharded before the reduce-scatter's input exists, so what
      is held is its bf16 gradient and the fp32 copy the reduce-scatter reads,
      ``GRAD_STAGING_BYTES · block``, beside the prefetched blocks' and the root's gathered
      parameters.  (The root's own reduce-scatter runs last, after every activation is freed.)

    A MoE block's parameters are large beside its activations, so the two moments differ there:
    priced at one moment (10 B per parameter beside the whole activation peak) a MoE FSDP plan
    came out 4–10 % above torch's tracker (RESULTS, "MoE, stop 32").
    """
    if plan.zero < 2:
        return 0.0
    resharded = not keeps_gathered(plan.zero, reshard=pol.reshard)

    def gathered(blocks: int) -> float:          # bf16 parameters gathered for a moment, root included
        return PARAM_BYTES * (blocks * block + root) if resharded else 0.0

    if not pol.reduce_every_microbatch:
        return PARAM_BYTES * block + gathered(1 + pol.prefetch)
    during = gathered(1 + pol.prefetch)
    after = GRAD_STAGING_BYTES * block + gathered(pol.prefetch)
    return max(during, after - freed)


def split_wgrad_bytes(plan: Plan, bag: Bag) -> float:
    """The weight half of a split backward under the zero 0/1 engine (pp > 1): torch's
    ``stage_backward_weight`` computes one parameter group's bf16 gradient, which apply folds
    into the fp32 main_grad before the next group (``apply.distributed_optimizer.
    split_weight_gradients_folded``, as Megatron-Core's weight-gradient GEMM accumulates into
    main_grad).  A group holds at least one parameter: ``PARAM_BYTES`` × the rank's largest
    (``Part.largest_param_numel``).  memcheck: 0.70 GiB under "other" on rank 31 of gpt3-175b
    ``tp=2,pp=32,cp=2,zbv``, whose largest parameter (fc1, 302 M local elements) is 0.56 GiB.
    A full backward folds each gradient in its accumulate hook, inside the layer's backward."""
    if plan.zero >= 2 or not splits_backward(plan):
        return 0.0
    return PARAM_BYTES * max((p.largest_param_numel for p, _ in bag), default=0)


def state_precision(name: str) -> StatePrecision:
    """The zero 0/1 engine's state dtypes by name (``costmodels.memory.STATE_PRECISIONS``)."""
    if name not in STATE_PRECISIONS:
        raise UserError(f"unknown state precision {name!r}",
                        f"use one of: {', '.join(sorted(STATE_PRECISIONS))}")
    return STATE_PRECISIONS[name]


RankKey = tuple[tuple[tuple[Part, int], ...], bool]    # a rank's (part, count) pairs, holds the last stage


@dataclass(frozen=True)
class BagStates:
    """What a rank holding one bag of parts keeps besides its activation peak (``bag_states``):
    bytes, and the parameters it holds."""

    params: float
    grads: float
    optimizer: float
    loss: float             # the loss buffers added to the activation peak (last stage, no split backward)
    other: float            # transients: recompute, FSDP staging, split-backward weight gradients
    dense_numel: float
    expert_numel: float

    @property
    def held(self) -> tuple[float, float, float, float, float]:
        """(params, grads, optimizer, loss, other): what ``rank_total`` sums."""
        return self.params, self.grads, self.optimizer, self.loss, self.other


class MemoryInputs(TypedDict):
    """What ``bag_states`` reads besides a rank's bag and the FSDP policy (``Estimator.memory_inputs``)."""

    dense_dp: int
    expert_dp: int
    loss: float
    ends: frozenset[Part]
    microbatches: int
    precision: StatePrecision
    fp8_engine: str             # EstimateOptions.fp8_engine (fp8_state_bytes)
    fp8_params: bool            # EstimateOptions.fp8_params


def fp8_state_bytes(plan: Plan, bag: Bag, engine: str, fp8_params: bool) -> float:
    """What an FP8 plan's engine keeps of a rank's weights beyond the model states (``params``):
    ``costmodels.precision.weight_copy_bytes`` per weight element its FP8 GEMMs read
    (``Part.fp8_weight_numel``) and the delayed-scaling amax histories of those GEMMs; 0 under bf16."""
    copies = weight_copy_bytes(plan.precision, engine, plan.zero, fp8_params)
    amax = amax_history_bytes(plan.precision, engine)
    if not copies and not amax:
        return 0.0
    return sum((p.fp8_weight_numel * copies + p.fp8_gemms * amax) * n for p, n in bag)


def rank_memory(plan: Plan, pipe: Pipeline, rank: int, live: LivePeak, *, dense_dp: int, expert_dp: int,
                loss: float, ends: frozenset[Part], microbatches: int, pol: Policy,
                precision: StatePrecision = StatePrecision(), fp8_engine: str = "transformer-engine",
                fp8_params: bool = False, memo: dict[RankKey, BagStates] | None = None) -> RankMemory:
    """Memory of pipeline rank ``rank``; ``live``: its activation peak; ``ends``: the pre/post
    parts (the root FSDP unit); ``loss``: ``loss_bytes`` of the plan.  ``memo``: one
    dict shared by the ranks of one plan (same other arguments), where ranks holding the same
    bag of parts share everything but their activation peak."""
    bag, key = rank_bag(pipe.bags, pipe.rank_chunks[rank])
    held = memo.get(key) if memo is not None else None
    if held is None:
        held = bag_states(plan, bag, key[1], dense_dp=dense_dp, expert_dp=expert_dp, loss=loss, ends=ends,
                          microbatches=microbatches, pol=pol, precision=precision, fp8_engine=fp8_engine,
                          fp8_params=fp8_params)
        if memo is not None:
            memo[key] = held
    return RankMemory(held.params, held.grads, held.optimizer, live.bytes + held.loss,
                      max(0.0, held.other - held.loss), held.dense_numel, held.expert_numel,
                      tuple(sorted(live.alive.items())))


def rank_bag(bags: Sequence[Bag], chunks: tuple[int, ...]) -> tuple[Bag, RankKey]:
    """The (part, count) pairs of a rank holding virtual stages ``chunks`` of ``bags``, and the key
    ranks holding the same parts share (the pairs, parts hashed whole, and whether the last
    stage is there)."""
    bag = [pn for c in chunks for pn in bags[c]]
    return bag, (tuple(bag), len(bags) - 1 in chunks)


def rank_groups(bags: Sequence[Bag], rank_chunks: Sequence[tuple[int, ...]]
                ) -> tuple[tuple[tuple[Bag, bool], ...], tuple[int, ...]]:
    """The distinct rank bags of a pipeline, (bag, holds the last stage) in first-rank order, and
    each rank's index among them (``rank_bag``'s key).  A rank holding the very bag lists of the
    rank before it (``stage_bags`` shares one list among the inner stages of the same layers and
    policy) is in its group without building its key."""
    index: dict[RankKey, int] = {}
    groups: list[tuple[Bag, bool]] = []
    of_rank: list[int] = []
    group = 0
    before: list[Bag] = []
    for chunks in rank_chunks:
        lists = [bags[c] for c in chunks]
        if lists != before:                  # the very same lists compare equal at once
            bag, key = rank_bag(bags, chunks)
            if key not in index:
                index[key] = len(groups)
                groups.append((bag, key[1]))
            group = index[key]
        of_rank.append(group)
        before = lists
    return tuple(groups), tuple(of_rank)


def rank_total(states: NDArray[np.float64], live_bytes: NDArray[np.float64]) -> NDArray[np.float64]:
    """``RankMemory.total`` of ranks with ``BagStates.held`` ``states`` (five rows, one column per
    rank) and ``live_bytes`` of activations at their peaks, to the bit (the same sums in the same
    order)."""
    params, grads, optimizer, last, other = states
    total: NDArray[np.float64] = params + grads + optimizer + (live_bytes + last) + np.maximum(0.0, other - last)
    return total


def rank_numels(pipe: Pipeline, rank: int) -> tuple[float, float]:
    """(dense, expert) parameters held by pipeline rank ``rank``, summed as ``bag_states`` sums them."""
    return bag_numels(rank_bag(pipe.bags, pipe.rank_chunks[rank])[0])


def bag_numels(bag: Bag) -> tuple[float, float]:
    """(dense, expert) parameters of (part, count) pairs."""
    return sum(p.dense_numel * n for p, n in bag), sum(p.expert_numel * n for p, n in bag)


def bag_states(plan: Plan, bag: Bag, holds_last: bool, *, dense_dp: int, expert_dp: int, loss: float,
               ends: frozenset[Part], microbatches: int, pol: Policy,
               precision: StatePrecision = StatePrecision(), fp8_engine: str = "transformer-engine",
               fp8_params: bool = False) -> BagStates:
    """The ``BagStates`` of a rank holding ``bag``; an FP8 plan's weight copies count as ``params``
    (``fp8_state_bytes``)."""
    dense, expert = bag_numels(bag)
    params, grads, optimizer = model_states(plan, dense, expert, dense_dp=dense_dp, expert_dp=expert_dp,
                                            microbatches=microbatches, pol=pol, precision=precision)
    params += fp8_state_bytes(plan, bag, fp8_engine, fp8_params)
    last = loss if holds_last and not splits_backward(plan) else 0.0
    roots = [p in ends for p, _ in bag]
    blocks = [p for (p, _), is_root in zip(bag, roots) if not is_root]
    root = sum(_numel(p) for (p, _), is_root in zip(bag, roots) if is_root)
    other = max((p.recompute_transient_bytes for p in blocks), default=0.0)
    biggest = max(blocks, key=_numel, default=None)
    if biggest is not None:
        other += fsdp_staging_bytes(plan, _numel(biggest), root, pol, freed=biggest.saved_bytes)
    other += split_wgrad_bytes(plan, bag)
    return BagStates(params, grads, optimizer, last, other, dense, expert)


def model_states(plan: Plan, dense: float, expert: float, *, dense_dp: int, expert_dp: int, microbatches: int,
                 pol: Policy, precision: StatePrecision = StatePrecision()) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of a rank holding ``dense`` and ``expert`` parameters (the
    module docstring's model states): each linear in the two counts."""
    st_dense = model_state_bytes(dense, zero=plan.zero, dp=dense_dp, reshard=pol.reshard, precision=precision)
    st_exp = model_state_bytes(expert, zero=plan.zero, dp=expert_dp, reshard=pol.reshard, precision=precision)
    grads = 0.0 if plan.zero >= 2 and microbatches == 1 else st_dense.grads + st_exp.grads
    if plan.zero >= 2 and not pol.reduce_every_microbatch:
        grads += (dense + expert) * UNSHARDED_GRAD_BYTES
    return st_dense.params + st_exp.params, grads, st_dense.optimizer + st_exp.optimizer


def splits_backward(plan: Plan) -> bool:
    """Whether the plan's pipeline runs B and W apart (a split-backward schedule, pp > 1).  Then
    the pipeline walk prices the last stage's loss buffers (they live at the start of that
    stage's B, and its peak may come at B's end, without them); otherwise ``rank_memory`` adds
    them to the rank's activation peak."""
    return plan.pp > 1 and SCHEDULE_SPECS[plan.schedule].split_backward


def walk_bytes(bags: Sequence[Bag], loss: float) -> tuple[list[float], list[float], list[float], list[float]]:
    """What ``costmodels.pipeline.live`` walks per virtual stage (model order), one micro-batch:
    the saved bytes, the input gradients kept from B to W under a split
    backward (``Part.wgrad_held_bytes``), the part of the saved bytes B frees
    (``Part.b_freed_bytes``: the loss's, on the last virtual stage) and the loss buffers
    (``loss_bytes``, on the last virtual stage; the walk reads them under a split backward
    only, ``splits_backward``).  The first virtual stage has neither held nor freed bytes: it sends
    no input gradient, so torch's ``PipelineStage.backward_one_chunk`` skips its B and runs its
    whole backward at W (torch 2.13 ``pipelining/stage.py``)."""
    saved, held, freed = per_bag(bags, lambda bag: (sum(p.saved_bytes * n for p, n in bag),
                                                    sum(p.wgrad_held_bytes * n for p, n in bag),
                                                    sum(p.b_freed_bytes * n for p, n in bag)))
    losses = [0.0] * (len(bags) - 1) + [loss]
    return saved, [0.0] + held[1:], [0.0] + freed[1:], losses


def _numel(p: Part) -> float:
    return p.dense_numel + p.expert_numel


def states_lower_bound(plan: Plan, dense: float, expert: float, *, dense_dp: int, expert_dp: int,
                       microbatches: int, pol: Policy, precision: StatePrecision = StatePrecision()) -> float:
    """Bytes per GPU no stage cut, schedule or recompute policy can avoid: the model states
    (``model_states``, the runtime's FSDP policy ``pol``) of an even share of the parameters.
    The states are linear in the parameter counts, so over the pipeline ranks their mean is
    this, and the busiest rank holds at least it; activations and transients only add."""
    return sum(model_states(plan, dense / plan.pp, expert / plan.pp, dense_dp=dense_dp, expert_dp=expert_dp,
                            microbatches=microbatches, pol=pol, precision=precision))
