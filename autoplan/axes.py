"""The one vocabulary of parallelism: mesh axes and the named rank groups built from them.

Throughout autoplan, *axis* means a mesh axis and *dim* a tensor dimension (as torchtitan's
``MeshAxisName`` says).  The mesh has five axes, innermost first by default:

=====  ==========================================================================
axis   size and what runs on its group
=====  ==========================================================================
tp     ``plan.tp``: TP/SP all-reduce, reduce-scatter, all-gather (per layer)
cp     ``plan.cp``: ring attention P2P / Ulysses all-to-all (per layer)
ep     ``plan.ep``: MoE token dispatch/combine all-to-all (per MoE layer)
dp     ``plan.dp / plan.ep``: the data-parallel ranks outside the ep axis
pp     ``plan.pp``: stage-to-stage P2P
=====  ==========================================================================

Expert parallelism is carved out of data parallelism (Megatron-Core), so the plan's ``dp``
degree is ``ep × (dp axis size)``.  Gradients are reduced over two composite groups:

* ``DENSE_DP`` = cp × ep × dp: every replica of a non-expert parameter (cp ranks hold the
  same weights as data-parallel ones);
* ``EXPERT_DP`` = cp × dp: every replica of one expert's parameters.

Under MoE parallel folding (a plan with ``etp``) the expert groups ``ep``, ``EXPERT_DP`` and
``EXPERT_TP`` come from a second rank layout, the expert mesh (``autoplan.mesh``): there the tp
axis has size etp, cp size 1 and dp size edp, so ``EXPERT_DP`` is the edp group; unfolded,
``EXPERT_TP`` is the tp group (experts are split over tp).
"""
from __future__ import annotations

from enum import Enum


class Axis(str, Enum):
    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"

    def __str__(self) -> str:
        return self.value


AXES: tuple[str, ...] = tuple(a.value for a in Axis)   # the canonical order, innermost first
DENSE_DP = "dense_dp"
EXPERT_DP = "expert_dp"
EXPERT_TP = "expert_tp"
EXPERT_GROUPS = frozenset((Axis.EP.value, EXPERT_DP, EXPERT_TP))   # read from the expert mesh when folded

# group name -> the axes whose coordinates vary inside one group
GROUP_AXES: dict[str, tuple[str, ...]] = {
    **{a.value: (a.value,) for a in Axis},
    DENSE_DP: ("cp", "ep", "dp"),
    EXPERT_DP: ("cp", "dp"),
    EXPERT_TP: ("tp",),
}
