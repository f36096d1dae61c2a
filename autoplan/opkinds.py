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


def attention_work_fraction(n: OpNode) -> float:
    """Share of an attention kernel's counted (full s²) FLOPs it executes, on one rank or on all.

    Causal, without a sliding window (whose FLOPs already count only the band): of the (s/T)²
    tiles of the whole sequence, the strictly lower ones and the diagonal, (1 + T/s)/2 ≤ 1 with
    tile T = ``FLASH_TILE``.  Context parallelism does not change it: a load-balanced ring (the
    sequence in 2·cp chunks, each rank a head and a tail chunk) computes its local step as two
    causal diagonal blocks and one full block and every other step as half a block, so a rank
    holding M = s/(cp·T) query tiles computes cp·M²/2 + M/2 of its cp·M² counted tiles,
    (1 + T/s)/2 whatever cp; Ulysses gives a rank whole sequences of fewer heads.  Other kernels
    and ops: 1."""
    if not (is_attention_kernel(n) and n.attention_causal) or n.attention_window or n.out is None:
        return 1.0
    shape = n.out.shape
    seq = shape[2] if len(shape) == 4 else shape[-2]
    return min(1.0, 0.5 * (1.0 + FLASH_TILE / max(seq, 1.0)))
