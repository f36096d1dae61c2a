"""What the block ILP takes and gives: its context, the pricing interface, and its results.

The ILP prices nothing itself: a ``Pricer`` (implemented by ``autoplan.cost.prices``) answers
"seconds of this op on one GPU" and "seconds of this collective on the plan's group of a
named mesh axis".  Everything the ILP returns is a frozen record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from autoplan.axes import Axis
from autoplan.ir import Strategy
from costmodels.memo import kept_hash, without_kept_hash

Gemm = tuple[float, float, float]
"""A GEMM's local (M, N, K) on one GPU (batch folded into M)."""


class Pricer(Protocol):
    """The only prices the block ILP needs."""

    def op_seconds(self, kind: str, flops: float, nbytes: float, gemm: Gemm | None) -> float:
        """Seconds of one local op (kind: gemm | gemm_fp8 | attention_fwd | attention_bwd | cast | memory)
        on one GPU."""
        ...

    def collective_seconds(self, kind: str, nbytes: float, axis: Axis) -> float:
        """Seconds of one collective of ``nbytes`` (nccl-tests size argument) on ``axis``'s group."""
        ...


# Tie-break toward lower activation memory when two layouts cost the same seconds: one second
# per 10¹⁵ bytes, far below any real time difference (a microsecond is worth a gigabyte).
MEMORY_TIE_BREAK_S_PER_BYTE = 1e-15


SOLVE_SECONDS = ("solve_seconds",)   # what a solve measures, not what it finds: the memo audit skips it


@dataclass(frozen=True)
class ShardingContext:
    """Everything the block ILP needs besides the graph.

    The block is traced at micro-batch 1 and the whole sequence; a GPU holds ``mbs``
    sequences and ``1/cp`` of each.  ``pricer`` prices ops and collectives on the tp axis.
    """

    tp: int
    sp: bool
    pricer: Pricer
    mbs: int = 1
    cp: int = 1
    recompute: str = "none"                       # none | selective | op | full (plan.RECOMPUTE)
    precision: str = "bf16"                       # the block's linear GEMMs (plan.PRECISIONS; bf16 in @pre/@post)
    # the precision a recomputed linear layer reruns its forward and runs its backward GEMMs in,
    # "" for ``precision`` (``price.outside_fp8_seconds``; EstimateOptions.fp8_recompute)
    recompute_precision: str = ""
    forbid_tp_collectives: bool = False           # the tp group leaves the NVLink domain (search mode)
    memory_weight_s_per_byte: float = MEMORY_TIE_BREAK_S_PER_BYTE
    merge_followers: bool = True
    backend: str = "cpsat"
    time_limit_s: float = 30.0

    def tp_seconds(self, kind: str, nbytes: float) -> float:
        return self.pricer.collective_seconds(kind, nbytes, Axis.TP)

    def op_seconds(self, kind: str, flops: float, nbytes: float, gemm: Gemm | None) -> float:
        return self.pricer.op_seconds(kind, flops, nbytes, gemm)


@dataclass(frozen=True)
class Collective:
    """One collective a block runs per micro-batch on its tp group."""

    kind: str            # all_reduce | reduce_scatter | all_gather | all_to_all
    nbytes: float        # nccl-tests size argument, bytes
    phase: str           # forward | backward (input grad) | wgrad
    tensor: str          # what is redistributed, e.g. "o_proj.mm -> add (P->R)"
    seconds: float       # time on the tp group


@dataclass(frozen=True)
class BlockSharding:
    """The solved sharding of one block kind for one (tp, sp, mbs, cp, recompute), priced."""

    strategies: dict[str, str]                 # node name -> strategy name
    placements: dict[str, str]                 # node name -> placement of output 0
    param_placements: dict[str, str]           # parameter name -> placement
    collectives: tuple[Collective, ...]
    forward_s: float                           # compute seconds, one micro-batch
    backward_s: float                          # input-gradient compute (incl. recompute)
    wgrad_s: float                             # weight-gradient compute
    recompute_s: float                         # part of backward_s spent recomputing
    saved_bytes: float                         # activations kept for backward, one micro-batch
    wgrad_held_bytes: float                    # input gradients kept from B to W (split backward), one micro-batch
    b_freed_bytes: float                       # of saved_bytes, what a split backward frees at B
                                               # (ir.freed_at_input_grad_nodes)
    param_numel: int                           # parameters held per GPU (after tp sharding)
    objective_s: float
    gap: float
    solve_seconds: float
    ilp_size: dict[str, int] = field(default_factory=dict)
    forward_launches: int = 0                  # kernels the host issues per micro-batch: forward
    backward_launches: int = 0                 # backward, weight gradients and recompute reruns
    wgrad_input_bytes: float = 0.0             # of saved_bytes, what the weight-gradient ops read (their
                                               # inputs X, ir.wgrad_input_nodes), one micro-batch
    routed_saved_bytes: float = 0.0            # of saved_bytes, the routed-expert region's (autoplan.routing)

    def comm_seconds(self, phase: str | None = None) -> float:
        return sum(c.seconds for c in self.collectives if phase is None or c.phase == phase)

    def count(self, kind: str, phase: str | None = None) -> int:
        return sum(1 for c in self.collectives if c.kind == kind and (phase is None or c.phase == phase))



@dataclass(frozen=True)
class BlockAssignment:
    """A solved ILP: the strategy of every node of one block graph on its tp axis.  Hashed by
    its choice, once (it keys the memo of what pricing it reads, ``solve._layout_reads``)."""

    choice: dict[str, Strategy]
    objective_s: float
    gap: float
    solve_seconds: float
    status: str
    ilp_size: dict[str, int]

    def __hash__(self) -> int:
        return kept_hash(self, lambda a: tuple(a.choice.items()))

    __getstate__ = without_kept_hash
