"""What a traced model is made of: parameters, FLOPs, blocks, heaviest ops, attention share.

Reads only the IR (``BlockGraph``); ``autoplan trace`` prints it.  FLOPs are
forward + backward of one micro-batch at the traced sequence length, as in
the graph (attention at full s², or a sliding window's band, flash backward
2.5× forward).
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.ir import BlockGraph, OpGraph, OpNode

MATMULS = ("aten.mm.", "aten.bmm.", "aten.addmm.", "aten.baddbmm.", "aten._grouped_mm.")


def _param_derived(graph: OpGraph, node: OpNode, memo: dict[str, bool]) -> bool:
    """True if ``node`` is a parameter placeholder or a view of one."""
    if node.name in memo:
        return memo[node.name]
    if node.op == "placeholder":
        result = node.role == "param"
    elif node.is_view and node.inputs:
        result = _param_derived(graph, graph.node(node.inputs[0].node), memo)
    else:
        result = False
    memo[node.name] = result
    return result


def is_attention(graph: OpGraph, node: OpNode, memo: dict[str, bool] | None = None) -> bool:
    """Core attention: SDPA kernels, and matmuls of two activations outside weight-gradient work
    (QKᵀ and PV of eager attention, forward and backward)."""
    if "scaled_dot_product" in node.op:
        return True
    if not node.op.startswith(MATMULS) or node.wgrad:
        return False
    memo = {} if memo is None else memo
    return not any(_param_derived(graph, graph.node(r.node), memo) for r in node.inputs)


def attention_flops(graph: OpGraph) -> float:
    memo: dict[str, bool] = {}
    return sum(n.flops for n in graph.ops() if is_attention(graph, n, memo))


@dataclass(frozen=True)
class OpShare:
    region: str          # pre | post | block kind
    count: int           # how many times the region runs per sample
    op: str
    module: str
    phase: str           # forward | backward (input gradient) | wgrad (weight gradient)
    flops: float         # FLOPs of this node times count
    share: float         # fraction of the model's FLOPs


def _regions(g: BlockGraph) -> list[tuple[str, OpGraph, int]]:
    return [("pre", g.pre, 1)] + [(b.kind, b.graph, b.count) for b in g.blocks] + [("post", g.post, 1)]


def heaviest_ops(g: BlockGraph, top: int = 10) -> list[OpShare]:
    """The ``top`` nodes by FLOPs across the model (a block's nodes count once per layer)."""
    total = g.flops_per_step_per_sample() * g.batch or 1.0
    rows = []
    for region, graph, count in _regions(g):
        for n in graph.ops():
            if n.flops > 0:
                phase = "wgrad" if n.wgrad else n.phase
                rows.append(OpShare(region, count, n.op, n.module, phase, n.flops * count,
                                    n.flops * count / total))
    rows.sort(key=lambda r: (-r.flops, r.region, r.module, r.op, r.phase))
    return rows[:top]


def summarize(g: BlockGraph) -> dict:
    """A JSON-ready summary of a traced model (keys sorted when dumped)."""
    total_flops = g.flops_per_step_per_sample() * g.batch
    tied = g._tied_param_count()
    head_params = g.post.param_count - tied
    attn = sum(attention_flops(graph) * count for _, graph, count in _regions(g))
    return {
        "model": g.model.name,
        "family": g.model.family,
        "seq": g.seq_len,
        "batch": g.batch,
        "dtype": g.dtype,
        "params": {
            "total": g.param_count,
            "embedding": g.pre.param_count,
            "head": head_params,
            "head_tied_to_embedding": tied > 0,
            "blocks": {b.kind: {"count": b.count, "each": b.graph.param_count,
                                "total": b.graph.param_count * b.count} for b in g.blocks},
        },
        "flops_per_token": g.flops_per_token,
        "flops_per_sample": total_flops / g.batch,
        "blocks": [{"kind": b.kind, "description": b.description, "count": b.count,
                    "params": b.graph.param_count, "flops": b.graph.flops() / g.batch,
                    "saved_bytes": b.graph.saved_bytes() / g.batch,
                    "first": b.module_paths[0] if b.module_paths else "",
                    "last": b.module_paths[-1] if b.module_paths else ""} for b in g.blocks],
        "order": list(g.order),
        "heaviest_ops": [{"region": r.region, "count": r.count, "op": r.op, "module": r.module,
                          "phase": r.phase, "flops": r.flops / g.batch, "share": r.share}
                         for r in heaviest_ops(g)],
        "attention_flops_share": attn / total_flops if total_flops else 0.0,
        "trace_seconds": g.trace_seconds,
        "trace_peak_rss_bytes": g.trace_peak_rss_bytes,
        "notes": list(g.model.notes),
    }
