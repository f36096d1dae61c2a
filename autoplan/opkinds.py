"""What kind of work a traced op is: the predicates the sharding ILP and the cost model share.

Written once here so that the block ILP, the cp pricer, recomputation and MFU agree on what
"attention" means:

* an **attention kernel** is a fused attention op (flash / memory-efficient / sdpa stand-in);
* a **score op** is an op of eager attention whose output has two sequence dims (the s×s
  scores, softmax, dropout masks: Korthikanti's 5·a·s²·b term);
* the **attention core** is both: what Megatron's selective recomputation recomputes and what
  context parallelism splits;
* a **model-FLOP op** is a GEMM or an attention-core op (Megatron/Korthikanti MFU counts GEMM and
  attention FLOPs only).

An attention kernel's *work* is not its counted FLOPs: FLOPs count full s² attention (the MFU
convention), while a causal flash kernel skips the key tiles wholly above the diagonal and
computes the diagonal tiles in full (``attention_work_fraction``).
"""
from __future__ import annotations

from autoplan.ir import OpGraph, OpNode


def is_attention_kernel(n: OpNode) -> bool:
    return "attention" in n.op


def is_score_op(n: OpNode) -> bool:
    return any(t is not None and sum(r == "seq" for r in t.dim_roles) >= 2 for t in n.outputs)


def is_attention_core(n: OpNode) -> bool:
    """An attention kernel, or an op of eager attention's s×s scores."""
    return is_attention_kernel(n) or is_score_op(n)


def op_kind(n: OpNode) -> str:
    """The compute profile an op is priced with: gemm | attention_fwd | attention_bwd | memory."""
    if n.gemm is not None:
        return "gemm"
    if is_attention_kernel(n):
        return "attention_bwd" if "backward" in n.op else "attention_fwd"
    return "memory"


def has_attention(graph: OpGraph) -> bool:
    return any(is_attention_core(n) for n in graph.ops())


def attention_flops(graph: OpGraph) -> float:
    return sum(n.flops for n in graph.ops() if is_attention_core(n))


def is_moe(graph: OpGraph) -> bool:
    """The graph holds expert parameters (a dim of role ``expert``)."""
    return any(n.out is not None and "expert" in n.out.dim_roles for n in graph.params())


def is_expert_param(n: OpNode) -> bool:
    return n.out is not None and "expert" in n.out.dim_roles


def is_model_flop_op(n: OpNode) -> bool:
    """A GEMM (eager attention's score bmm included) or a fused attention kernel."""
    return n.gemm is not None or is_attention_kernel(n)


FLASH_TILE = 128          # query/key tile of FlashAttention-2/3 kernels (Dao 2023, §3.3: 128×128 blocks)


def attention_work_fraction(n: OpNode, cp: int = 1) -> float:
    """Share of an attention kernel's counted (full s²) FLOPs it executes on one rank.

    Causal, without a sliding window (whose FLOPs already count only the band): of the
    (s_l/T)² tiles of a rank's s_l = s/cp queries (load-balanced chunks: every rank gets an equal
    share of the triangle), the strictly lower ones and the diagonal, (1 + T/s_l)/2 ≤ 1 with
    tile T = ``FLASH_TILE``.  Other kernels and ops: 1."""
    if not (is_attention_kernel(n) and n.attention_causal) or n.attention_window or n.out is None:
        return 1.0
    shape = n.out.shape
    s_local = (shape[2] if len(shape) == 4 else shape[-2]) / max(cp, 1)
    return min(1.0, 0.5 * (1.0 + FLASH_TILE / max(s_local, 1.0)))
