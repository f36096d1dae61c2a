"""Memory per GPU: model states by ZeRO stage, activations, and the closed forms they are checked against.

Model states (mixed-precision Adam, Megatron accounting), for ``n`` parameters held by a GPU
after tensor/pipeline/expert sharding, over a data-parallel group of ``dp`` ranks:

=========  =====================  ==================================================
state      bytes per parameter    sharded over dp when
=========  =====================  ==================================================
params     2 (bf16 weights)       zero ≥ 3 (FSDP)
grads      4 (fp32 main grads)    zero ≥ 2
optimizer  12 (fp32 master, m, v) zero ≥ 1 (distributed optimizer)
=========  =====================  ==================================================

Activations come from the traced graph (bytes saved for backward per micro-batch, see
``autoplan.sharding``) times the micro-batches a pipeline rank holds in flight
(``costmodels.pipeline``).  ``korthikanti_layer_bytes`` gives the published per-layer
formulas (Korthikanti et al. 2022, Table 2) that the traced numbers are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 ** 3
PARAM_BYTES = 2.0
GRAD_BYTES = 4.0
OPTIMIZER_BYTES = 12.0
# CUDA context, NCCL buffers, allocator fragmentation and workspace: a fixed reserve per GPU.
OVERHEAD_BYTES = 4.0 * GIB


@dataclass(frozen=True)
class StateBytes:
    """Bytes of parameters, gradients and optimizer state on one GPU."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(numel: float, *, zero: int, dp: int, param_bytes: float = PARAM_BYTES,
                      grad_bytes: float = GRAD_BYTES, optimizer_bytes: float = OPTIMIZER_BYTES) -> StateBytes:
    """States of ``numel`` parameters on one GPU under ZeRO stage ``zero`` over ``dp`` ranks."""
    return StateBytes(
        params=numel * param_bytes / (dp if zero >= 3 else 1),
        grads=numel * grad_bytes / (dp if zero >= 2 else 1),
        optimizer=numel * optimizer_bytes / (dp if zero >= 1 else 1),
    )


def korthikanti_layer_bytes(*, s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                            recompute: str = "none") -> float:
    """Activation bytes of one transformer layer (Korthikanti et al. 2022, Table 2).

    16-bit activations, 1-byte dropout masks, multi-head attention, 4h GeLU MLP:

    * no parallelism:          s·b·h·(34 + 5·a·s/h)
    * tensor parallel:         s·b·h·(10 + 24/t + 5·a·s/(h·t))
    * tensor + sequence par.:  s·b·h·(34/t + 5·a·s/(h·t))
    * selective recompute drops the 5·a·s/h term (attention core recomputed)
    * full recompute:          2·s·b·h (the layer input only)
    """
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh
    core = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if t == 1 or sp:
        return sbh * (34.0 / t + core)
    return sbh * (10.0 + 24.0 / t + core)
