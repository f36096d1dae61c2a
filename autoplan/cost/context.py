"""``PlanContext``: one plan as the pricers read it, with the workload and cluster facts they need.

Every per-parallelism pricer takes ``(ctx, graph)`` and what is its own to vary (an attention
time, a recompute policy, a bag, a micro-batch count, a rank's parameter count) instead of the
plan, its mesh, the prices, the model's facts and the options one by one.  ``Estimator.context``
builds it.

Memo keys: every field but ``plan`` and ``mesh`` is fixed per Estimator (its model, cluster,
options and ``Prices``), and ``mesh`` is ``Mesh.of(plan)``; so a value computed from a context
is keyed on the projection of the plan it reads (``cost.memo``: ``PartKey``, ``BagKey``,
``ShapeKey``, ``PlanAt``), and ``tests/autoplan/cost/test_memo_keys.py`` checks that the
projection holds every plan field the pricers read.  A context is never a key itself: it is
unhashable, so a memo cannot take it whole.

The plan's own choices reach the pricers through ``ctx.plan`` and ``ctx.options`` like the rest:
its ``precision`` (``dp``: FSDP2's FP8 gather and the optimizer's weight cast; ``fsdp.chunk_units``),
its USP split (``plan.ulysses``, read by ``cp`` through ``rules.ulysses_and_ring``) and
``EstimateOptions.post_validation`` (``pp.price_pipeline``: the steady step).

Sizes come from the traced graph, not from constants: ``hidden`` is the residual width and
``activation_bytes`` the element size of the residual stream (the first block's input), read off
its traced dtype as ``cost.memory`` reads every saved tensor's (``sharding.local.bytes_per_elem``):
what a stage boundary sends.  The cp and ep pricers read the element size of what they send off
the graph they price (``cp.attention_bytes``, ``activation_bytes``).  A bf16 trace gives 2; a
trace whose tensors carry another dtype (fp32) is priced at its own.  A plan's FP8 ``precision``
is its linear GEMMs' (``costmodels.precision``), not its activations': they stay as traced, and
an FP8 plan sends the bf16 plan's bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.prices import Prices
from autoplan.cost.types import EstimateOptions
from autoplan.ir import DTYPE_BYTES, BlockGraph, ModelInfo, OpGraph, OpNode
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.sharding.local import bytes_per_elem


@dataclass(frozen=True, slots=True)
class PlanContext:
    """A plan, its mesh, and what its pricers read of the workload and the cluster."""

    plan: Plan
    mesh: Mesh                    # Mesh.of(plan)
    prices: Prices                # op, collective and simulator prices of the cluster (and profile, params)
    options: EstimateOptions
    model: ModelInfo
    seq_len: int                  # sequence positions of one sample (BlockGraph.sample_positions)
    hidden: int                   # the residual width (``hidden_of``)
    activation_bytes: float       # element size of the residual stream, what crosses a stage boundary

    __hash__ = None  # type: ignore[assignment]  # unhashable: never a memo key (module docstring)


def block_input(graph: OpGraph) -> OpNode | None:
    """The placeholder of the residual stream entering ``graph``, or None."""
    return next((n for n in graph.nodes if n.op == "placeholder" and n.role == "input" and n.out is not None), None)


def activation_bytes(graph: OpGraph) -> float:
    """Bytes per element of the activation entering ``graph`` (its residual stream) as traced;
    the graph's dtype where it has no activation input."""
    entry = block_input(graph)
    if entry is None or entry.out is None:
        return DTYPE_BYTES.get(graph.dtype, 4)
    return bytes_per_elem(entry.out)


def hidden_of(model: BlockGraph) -> int:
    """The residual width: the last dim of the first block's input."""
    entry = block_input(model.blocks[0].graph)
    return entry.out.shape[-1] if entry is not None else 0  # type: ignore[union-attr]  # block_input: out is set
