"""Memory per GPU: model states by ZeRO stage and engine, and the closed forms activations are checked against.

Model states (mixed-precision Adam, bf16 compute), bytes per parameter a GPU holds after
tensor/pipeline/expert sharding, over a data-parallel group of ``d`` ranks:

====  ========================================  ==========  =====  =========  ===========
zero  engine                                    params      grads  optimizer  total
====  ========================================  ==========  =====  =========  ===========
0     Megatron DDP, fp32 grad buffer            2           4      12         18
1     Megatron-Core distributed optimizer       2           4      12/d       6 + 12/d
2     FSDP2, parameters kept after forward      2 + 4/d     4/d    8/d        2 + 16/d
3     FSDP2 (torchtitan), resharded             4/d         4/d    8/d        16/d
3     … under pipeline parallelism              2 + 4/d     4/d    8/d        2 + 16/d
====  ========================================  ==========  =====  =========  ===========

* Megatron (zero 0/1): bf16 parameters, an fp32 gradient buffer (Megatron-LM sets
  ``accumulate_allreduce_grads_in_fp32`` for bf16), fp32 master weights + Adam m, v (12 B);
  the distributed optimizer shards the last over dp — Megatron-Core's
  ``docs/source/api-guide/dist_optimizer.md`` table, "bf16 param, fp32 grads: 6 + 12/d".
* ``state_precision`` (``STATE_PRECISIONS``) names what the zero 0/1 engine keeps per
  parameter (compute weight, gradient buffer, master weight, Adam m + v; the last two sharded
  under zero 1); zero ≥ 2 is FSDP2's own (below).  ``megatron`` (the default) is the row above:
  2 / 4 / 4 / 8.  ``apex-dfa-bf16`` is NeMo's ``distributed_fused_adam`` (Apex
  ``DistributedFusedAdam``: a contiguous gradient bucket in ``grad_sync_dtype``, the parameter
  copy and Adam moments in ``dtype``, sharded over dp) with ``dtype: bf16, grad_sync_dtype: bf16``,
  as NVIDIA's DGXC Nemotron-4 340B benchmark runs it (``NVIDIA/dgxc-benchmarking``
  ``nemotron/nemotron4-340b-synth.yaml`` @8f5cbb37, NeMo 24.09 container): 2 / 2 / 2 / 4,
  ``4 + 6/d`` bytes per parameter.  ``megatron-bf16-grads`` is Megatron-Core with
  ``grad_reduce_in_fp32`` off (a bf16 main-gradient buffer, reduced in bf16), as Megatron-Bridge's
  performance recipes set it (``scripts/performance/configs/llama/llama3_llm_pretrain.py``,
  ``set_llama3_common_configs``): 2 / 2 / 4 / 8, ``4 + 12/d``.
* FSDP2 with torchtitan's mixed precision (``param_dtype`` bf16, ``reduce_dtype`` fp32): the
  sharded fp32 parameter is the master copy (4/d), its fp32 gradient shard (4/d), Adam m, v
  (8/d); the bf16 unsharded parameters (2) stay alive from forward to backward when
  ``reshard_after_forward`` is off — zero 2, and zero 3 under pipeline parallelism, where
  torchtitan turns it off (``parallelize.py``: ``reshard_after_forward = not pp_enabled``).

Activations come from the traced graph (bytes saved for backward per micro-batch, see
``autoplan.sharding``) times the micro-batches a pipeline rank holds in flight
(``costmodels.pipeline.live``).  ``korthikanti_layer_bytes`` gives the published per-layer
formulas (Korthikanti et al. 2022, Table 2) that the traced numbers are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

GIB = 1024 ** 3
PARAM_BYTES = 2.0          # bf16 weight
GRAD_BYTES = 4.0           # fp32 gradient
OPTIMIZER_BYTES = 12.0     # fp32 master weight, Adam m and v
MASTER_BYTES = 4.0         # fp32 master weight (FSDP: the sharded parameter itself)


@dataclass(frozen=True)
class StatePrecision:
    """Bytes per parameter of each model state a zero 0/1 engine keeps (module docstring)."""

    param: float = PARAM_BYTES        # the compute copy
    grad: float = GRAD_BYTES          # the buffer backward accumulates into
    master: float = MASTER_BYTES      # the optimizer's copy of the weight
    moments: float = OPTIMIZER_BYTES - MASTER_BYTES   # Adam m + v

    @property
    def optimizer(self) -> float:
        return self.master + self.moments


StatePrecisionName = Literal["megatron", "apex-dfa-bf16", "megatron-bf16-grads"]   # STATE_PRECISIONS' keys, in order
STATE_PRECISION_NAMES: tuple[StatePrecisionName, ...] = get_args(StatePrecisionName)
STATE_PRECISIONS: dict[str, StatePrecision] = {
    "megatron": StatePrecision(),
    "apex-dfa-bf16": StatePrecision(param=2.0, grad=2.0, master=2.0, moments=4.0),
    "megatron-bf16-grads": StatePrecision(param=2.0, grad=2.0),
}


@dataclass(frozen=True)
class StateBytes:
    """Bytes of parameters, gradients and optimizer state on one GPU."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def keeps_gathered(zero: int, *, reshard: bool) -> bool:
    """Whether FSDP keeps the bf16 unsharded parameters from forward to backward: zero 2, and
    zero 3 without reshard-after-forward (torchtitan's default under pipeline parallelism:
    ``reshard_after_forward = not pp_enabled``)."""
    return zero == 2 or (zero == 3 and not reshard)


def model_state_bytes(numel: float, *, zero: int, dp: int, reshard: bool = True,
                      precision: StatePrecision = StatePrecision()) -> StateBytes:
    """States of ``numel`` parameters on one GPU under ZeRO stage ``zero`` over ``dp`` ranks
    (the table of the module docstring; ``precision`` is the zero 0/1 engine's)."""
    if zero <= 1:
        return StateBytes(numel * precision.param, numel * precision.grad,
                          numel * precision.optimizer / (dp if zero == 1 else 1))
    gathered = numel * PARAM_BYTES if keeps_gathered(zero, reshard=reshard) else 0.0
    return StateBytes(gathered + numel * MASTER_BYTES / dp, numel * GRAD_BYTES / dp,
                      numel * (OPTIMIZER_BYTES - MASTER_BYTES) / dp)


def korthikanti_layer_bytes(*, s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                            recompute: str = "none") -> float:
    """Activation bytes of one transformer layer (Korthikanti et al. 2022, Table 2).

    16-bit activations, 1-byte dropout masks, multi-head attention, 4h GeLU MLP:

    * no parallelism:          s·b·h·(34 + 5·a·s/h)
    * tensor parallel:         s·b·h·(10 + 24/t + 5·a·s/(h·t))
    * tensor + sequence par.:  s·b·h·(34/t + 5·a·s/(h·t))
    * selective recompute drops the 5·a·s/h term (attention core recomputed)
    * full recompute:          2·s·b·h (the layer input only); 2·s·b·h/t with sequence
      parallelism, whose layer input is sharded along the sequence (Table 2 lists the
      unsharded input; Megatron-LM checkpoints the [s/t, b, h] input under SP)
    """
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    core = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if t == 1 or sp:
        return sbh * (34.0 / t + core)
    return sbh * (10.0 + 24.0 / t + core)
