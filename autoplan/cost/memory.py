"""Memory per GPU of one pipeline rank: model states, activations in flight, logits, reserve.

=============  ==========================================================================
category       bytes
=============  ==========================================================================
params, grads, ``costmodels.memory.model_state_bytes`` of the rank's dense parameters over
optimizer      the dense dp group and its expert parameters over the expert dp group, by ZeRO stage
activations    peak micro-batches in flight on the rank (from the simulated schedule) × the
               mean saved bytes of its virtual stages (the traced graph's saved tensors), plus
               on the last stage the fp32 logits and their gradient, ``b·(s/cp)·V/tp·4·2``
other          ``OVERHEAD_BYTES`` reserve; under ZeRO-3 (``fsdp.Policy``) 1 + prefetch layers'
               gathered bf16 parameters (the one computing and those prefetched) with
               reshard-after-forward on, else all of the rank's; and the rank's unsharded bf16
               gradients when they are reduced only at the last backward (PP's no-sync)
=============  ==========================================================================
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.dp import PARAM_GATHER_BYTES
from autoplan.cost.fsdp import Policy
from autoplan.cost.pp import Pipeline
from autoplan.plan import Plan
from costmodels.memory import OVERHEAD_BYTES, model_state_bytes

LOGITS_BYTES = 4 * 2                  # fp32 logits and their gradient
ZERO3_GATHERED_LAYERS = 2             # computing + prefetched (FSDP2's default prefetch of one unit)
UNSHARDED_GRAD_BYTES = 2              # bf16 gradients accumulated unsharded under no-sync


@dataclass(frozen=True)
class RankMemory:
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    dense_numel: float
    expert_numel: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def breakdown(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other}


def logits_bytes(plan: Plan, seq_len: int, vocab: int) -> float:
    return plan.mbs * seq_len / plan.cp * vocab / plan.tp * LOGITS_BYTES


def rank_memory(plan: Plan, pipe: Pipeline, rank: int, *, dense_dp: int, expert_dp: int,
                logits: float, pol: Policy | None = None) -> RankMemory:
    chunks = pipe.rank_chunks[rank]
    bag = [pn for c in chunks for pn in pipe.bags[c]]
    dense = sum(p.dense_numel * n for p, n in bag)
    expert = sum(p.expert_numel * n for p, n in bag)
    st_dense = model_state_bytes(dense, zero=plan.zero, dp=dense_dp)
    st_exp = model_state_bytes(expert, zero=plan.zero, dp=expert_dp)
    per_chunk = [sum(p.saved_bytes * n for p, n in pipe.bags[c]) for c in chunks]
    act = pipe.sim.peak_activations[rank] * (sum(per_chunk) / max(len(per_chunk), 1))
    if len(pipe.bags) - 1 in chunks:
        act += logits
    other = OVERHEAD_BYTES
    if plan.zero >= 3:
        other += _zero3_gathered(bag, dense + expert, pol or Policy(ZERO3_GATHERED_LAYERS - 1, True, True))
    return RankMemory(st_dense.params + st_exp.params, st_dense.grads + st_exp.grads,
                      st_dense.optimizer + st_exp.optimizer, act, other, dense, expert)


def _zero3_gathered(bag, numel: float, pol: Policy) -> float:
    """Bytes of gathered parameters (and unsharded gradients) FSDP2 holds on top of the shards."""
    if not pol.reshard:
        gathered = numel * PARAM_GATHER_BYTES
    else:
        biggest = max((p.dense_numel + p.expert_numel for p, _ in bag), default=0)
        gathered = (1 + pol.prefetch) * biggest * PARAM_GATHER_BYTES
    return gathered + (0.0 if pol.reduce_every_microbatch else numel * UNSHARDED_GRAD_BYTES)


def states_lower_bound(plan: Plan, dense: float, expert: float, *, dense_dp: int, expert_dp: int) -> float:
    """Bytes per GPU no stage cut can avoid: model states of an even share of the parameters
    under the plan's ZeRO stage, plus the fixed reserve."""
    d = model_state_bytes(dense / plan.pp, zero=plan.zero, dp=dense_dp)
    e = model_state_bytes(expert / plan.pp, zero=plan.zero, dp=expert_dp)
    return d.total + e.total + OVERHEAD_BYTES
