"""What an FP8 plan's engine keeps in memory beyond the bf16 trace, per graph and micro-batch.

The trace records a bf16 model: each linear layer's GEMM reads its activation input X and the
weight-gradient GEMM reads X again in backward, so X is saved in bf16.  Under an FP8 precision
with Transformer Engine (``EstimateOptions.fp8_engine``; ``costmodels.precision``'s table) the
linear layer keeps the FP8 cast of X instead (``saved_input_bytes``: the columnwise copy the
weight-gradient GEMM reads, 1 byte per element, +1/32 under MXFP8), so:

* an X that only GEMMs read in backward (the q/k/v input, the MLP input, the down projection's
  input) is kept at the FP8 size instead of the bf16 one;
* an X that another op also reads in backward keeps its bf16 copy, and the FP8 one comes beside
  it: flash attention keeps its output for its own backward, which is the o-projection's input.

An X read by several GEMMs (q, k and v; gate and up) is cast and kept once, as the engines' fused
QKV and fc1 GEMMs do.  Counted where the policy saves X: with no recomputation and under
``selective`` (the attention core's recompute keeps its output, the o-projection's input);
under ``full`` the layer keeps only its input and ``op`` caches what torch's checkpointing
keeps — neither changes (the recomputed layer's FP8 casts are the recompute transient's).

``weight_numel``: the elements of the weights the graph's FP8 GEMMs read (local, after tp and
ep), what ``costmodels.precision.weight_copy_bytes`` and ``amax_history_bytes`` multiply in
``cost.memory``; ``fp8_gemms``: how many linear layers run in FP8 (the amax histories' count).
The pre/post graphs (embedding, LM head) stay bf16 (``cost.tp.gemm_precision``).
"""
from __future__ import annotations

from typing import NamedTuple

from autoplan.ir import OpGraph, OpNode, TensorRef
from autoplan.opkinds import is_attention_kernel, is_expert_param
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding
from autoplan.sharding.local import bytes_per_elem, local_bytes
from autoplan.sharding.placements import is_shard
from autoplan.sharding.price import is_linear_gemm, recomputed
from costmodels.precision import is_low_precision, saved_input_bytes

SAVING_POLICIES = ("none", "selective")     # recompute policies under which the FP8 inputs are kept


class LinearGemm(NamedTuple):
    """A forward linear-layer GEMM: its node, its activation input and its weight (bases of views)."""

    node: OpNode
    input: TensorRef
    weight: TensorRef


class Fp8Weights(NamedTuple):
    """What a graph's FP8 GEMMs read of its weights: local elements, and how many GEMMs."""

    numel: float
    gemms: int


def _base(graph: OpGraph, ref: TensorRef) -> TensorRef:
    """The value ``ref`` views (itself when its producer is not a view)."""
    node = graph.node(ref.node)
    while node.is_view and node.inputs:
        ref = node.inputs[0]
        node = graph.node(ref.node)
    return ref


def linear_gemms(graph: OpGraph) -> list[LinearGemm]:
    """(node, activation input, weight) of each forward linear-layer GEMM: a forward GEMM that
    reads a parameter (through views; ``addmm`` its bias too) and is not the attention core."""
    out = []
    for n in graph.ops("forward"):
        if not is_linear_gemm(n):
            continue
        bases = [_base(graph, r) for r in n.inputs]
        weights = [b for b in bases if graph.node(b.node).role == "param"]
        acts = [b for b in bases if graph.node(b.node).role != "param"]
        if weights and acts:            # addmm reads a bias too: the weight is the largest parameter
            out.append(LinearGemm(n, acts[0], max(weights, key=lambda b: _numel(graph, b))))
    return out


def _numel(graph: OpGraph, ref: TensorRef) -> int:
    t = graph.tensor(ref)
    return t.numel if t is not None else 0


def _kept(graph: OpGraph, ref: TensorRef, recompute: str) -> bool:
    """Whether the policy keeps the value ``ref`` from forward to backward (``price.saved_bytes``)."""
    if ref not in graph.saved_outputs():
        return False
    node = graph.node(ref.node)
    if node.op == "placeholder":
        return recompute != "full"
    return not recomputed(graph, node, recompute) or (ref.index == 0 and is_attention_kernel(node))


def saved_delta_bytes(graph: OpGraph, bs: BlockSharding, plan: Plan, precision: str, recompute: str,
                      engine: str, skip: frozenset[str] = frozenset()) -> float:
    """Bytes one micro-batch of ``graph`` keeps beyond its traced saved bytes when its GEMMs run
    at ``precision`` (``cost.tp.gemm_precision``) on ``engine`` (module docstring): negative
    where FP8 inputs replace bf16 ones.  The GEMMs of the nodes ``skip`` are left out (an MoE
    layer's routed GEMMs where the engine's own account replaces them, ``cost.parts``)."""
    fp8 = saved_input_bytes(precision, engine)
    if fp8 is None or recompute not in SAVING_POLICIES:
        return 0.0
    delta = 0.0
    for ref in dict.fromkeys(g.input for g in linear_gemms(graph) if g.node.name not in skip):
        t = graph.tensor(ref)
        if t is None or not _kept(graph, ref, recompute):
            continue
        placement = bs.placements.get(ref.node) if ref.index == 0 else None
        kept = local_bytes(t, placement, plan.tp, plan.mbs, plan.cp)
        cast = kept / bytes_per_elem(t) * fp8 if bytes_per_elem(t) else 0.0
        backward = [u for u in graph.readers_through_views(ref.node, ref.index) if u.phase == "backward"]
        only_gemms = all(is_linear_gemm(u) for u in backward)
        delta += cast - kept if only_gemms else cast
    return delta


def weight_numel(graph: OpGraph, bs: BlockSharding, plan: Plan, precision: str) -> Fp8Weights:
    """(local elements of the weights the graph's FP8 GEMMs read, FP8 GEMMs) when they run at
    ``precision``: 0 under bf16."""
    if not is_low_precision(precision):
        return Fp8Weights(0.0, 0)
    gemms = linear_gemms(graph)
    numel = 0.0
    for ref in dict.fromkeys(g.weight for g in gemms):
        node = graph.node(ref.node)
        t = node.out
        if t is None:
            continue
        if is_expert_param(node) and plan.folded:        # as cost.parts counts the parameters
            numel += t.numel / (plan.expert_tp * plan.ep)
            continue
        sharded = is_shard(bs.param_placements.get(node.param or node.name, "R"))
        numel += t.numel / (plan.tp if sharded else 1) / (plan.ep if is_expert_param(node) else 1)
    return Fp8Weights(numel, len(gemms))
