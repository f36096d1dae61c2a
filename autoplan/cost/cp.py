"""Context parallelism: attention's sequence split over the cp axis, ring, Ulysses or both (USP).

Per micro-batch and GPU, for a block with attention (s = sequence, b = mbs, a_kv = KV heads,
d = head dim, h = hidden, n = cp; e_q and e_kv bytes per element of q and of k as the attention
kernel reads them, ``attention_bytes``: 2 in bf16):

* **ring** (Liu et al. 2023, Megatron-Core ``--context-parallel-size``): each of the n−1 hops
  passes this rank's K and V chunk, ``2·b·(s/n)·a_kv·d·e_kv/tp`` bytes, P2P to the next rank;
  forward n−1 hops, backward 2·(n−1) (K/V again and their gradients).  All ranks send at
  once, so a hop takes the ring's slowest (the wrap-around included).  The pass runs as n
  steps, each an attention kernel on one K/V chunk (load-balanced chunks: every step 1/n of
  the rank's work c) overlapping the next hop h: the pass takes (n−1)·max(c/n, h) + c/n, so
  exposed = (n−1)·(max(0, h − c/n) + k), k being the launch of the extra kernels per step
  (counted in the ring's time with its hops).
* **Ulysses** (Jacobs et al. 2023): q, k, v and the output are re-sharded heads↔sequence with
  one all-to-all each (4 per pass, forward and backward), on the critical path: q and o
  ``b·(s/n)·(a/tp)·d·e_q`` bytes per rank, k and v ``b·(s/n)·a'·d·e_kv`` with a' = max(a_kv/tp, u)
  KV heads: under GQA with fewer KV heads on a tp rank than Ulysses ranks, Megatron and USP
  replicate them to u so that each rank gets one (its all-to-all and ring hops move the copies).
* **USP** (Fang & Zhao 2024): Ulysses over u ranks inside the NVLink domain, ring over r = n/u
  across.  After the all-to-all a rank holds s/r tokens of a_kv/u KV heads, so a ring hop passes
  ``2·b·(s/r)·(a_kv/u)·d·e_kv/tp`` = the ring's own chunk at cp = n, not u times it.

Attention's time per phase is what its kernels execute (``attention_seconds``): the forward
kernel's and the backward kernel's FLOPs as traced (flash backward = 2.5× forward: Dao 2023,
§3.1, 5 GEMMs vs 2, the frontend's count), at the fraction of them a causal kernel computes
(``opkinds.attention_work_fraction``), each at its own efficiency.
"""
from __future__ import annotations

from typing import NamedTuple

from autoplan.axes import Axis
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.prices import Prices
from autoplan.cost.types import AxisCost, Comm
from autoplan.ir import OpGraph
from autoplan.opkinds import attention_work_fraction, has_attention, is_attention_core, is_attention_kernel, op_kind
from autoplan.rules import ulysses_and_ring
from autoplan.sharding.local import bytes_per_elem

ULYSSES_QO = 2                          # all-to-alls per pass at the heads' width: q and the output
ULYSSES_KV = 2                          # ... and at the KV heads' width: k and v


def attention_seconds(ctx: PlanContext, graph: OpGraph) -> tuple[float, float]:
    """(forward, backward) compute seconds of the attention core (kernels and s×s score ops),
    per micro-batch, per GPU: the kernels' real work (causal tiles only) on 1/cp of the sequence."""
    plan, prices = ctx.plan, ctx.prices
    out = {"forward": 0.0, "backward": 0.0}
    for n in graph.ops():
        if is_attention_core(n):
            gemm = None
            if n.gemm:
                m, nn, k = n.gemm
                gemm = (m * plan.mbs / plan.cp, nn, k)
            scale = plan.mbs / plan.cp / plan.tp
            out[n.phase] += prices.op_seconds(op_kind(n), n.flops * scale * attention_work_fraction(n),
                                              (n.bytes_read + n.bytes_written) * scale, gemm)
    return out["forward"], out["backward"]


def _kernels(graph: OpGraph, phase: str) -> int:
    return sum(1 for n in graph.ops(phase) if is_attention_kernel(n))


def attention_bytes(graph: OpGraph) -> tuple[float, float]:
    """Bytes per element of (q, k) as the first forward attention kernel reads them, as traced
    (o is sent at q's, v at k's); without such a kernel (eager attention), those of the activation
    entering the graph."""
    kernel = next((n for n in graph.ops("forward") if is_attention_kernel(n) and len(n.inputs) >= 2), None)
    q, k = (None, None) if kernel is None else (graph.tensor(kernel.inputs[0]), graph.tensor(kernel.inputs[1]))
    if q is None or k is None:
        both = activation_bytes(graph)
        return both, both
    return bytes_per_elem(q), bytes_per_elem(k)


class CpShape(NamedTuple):
    """Bytes one rank moves per micro-batch under a (Ulysses u, ring r) split (module docstring)."""

    qo_bytes: float          # one of q / o (and their gradients): b·(s/n)·(a/tp)·d·e_q
    kv_a2a_bytes: float      # one of k / v in Ulysses' all-to-all: b·(s/n)·max(a_kv/tp, u)·d·e_kv
    ring_bytes: float        # K and V of a ring hop: 2·b·(s/n)·max(a_kv/tp, u)·d·e_kv

    @staticmethod
    def of(ctx: PlanContext, graph: OpGraph, ulysses: int) -> CpShape:
        """The shape of ``ctx.plan``'s sends for ``graph`` with ``ulysses`` ranks in each Ulysses
        group, at the element sizes the graph's attention reads (``attention_bytes``)."""
        info, plan = ctx.model, ctx.plan
        q_elem, kv_elem = attention_bytes(graph)
        heads = max(info.heads, 1)
        head_dim = info.head_dim or ctx.hidden // heads
        tokens = plan.mbs * ctx.seq_len / plan.cp
        # KV heads on a tp rank (Megatron replicates them when tp > a_kv), then on a Ulysses rank
        # at least one: fewer than u are replicated to u before the all-to-all (Megatron, USP)
        kv = max((info.kv_heads or heads) / plan.tp, 1.0, float(ulysses))
        return CpShape(tokens * heads * head_dim * q_elem / plan.tp,
                       tokens * kv * head_dim * kv_elem, 2 * tokens * kv * head_dim * kv_elem)


def _ulysses(prices: Prices, shape: CpShape, ranks: tuple[int, ...]) -> tuple[float, list[Comm]]:
    """Seconds per pass of Ulysses' four all-to-alls (q and o at the heads' width, k and v at the
    KV heads'), the same forward and backward, and their records."""
    qo = prices.collective("all_to_all", shape.qo_bytes, ranks)
    kv = prices.collective("all_to_all", shape.kv_a2a_bytes, ranks)
    t = ULYSSES_QO * qo + ULYSSES_KV * kv
    out = [Comm(Axis.CP.value, "all_to_all", nbytes, n * one, n * one, phase, calls=n, purpose=purpose, ranks=ranks)
           for phase in ("forward", "backward")
           for nbytes, n, one, purpose in ((shape.qo_bytes, ULYSSES_QO, qo, "ulysses"),
                                           (shape.kv_a2a_bytes, ULYSSES_KV, kv, "ulysses-kv"))]
    return t, out


def cp_cost(ctx: PlanContext, graph: OpGraph, attention_s: tuple[float, float]) -> AxisCost:
    """Exposed forward/backward seconds of context parallelism for one graph, and its collectives."""
    plan, mesh, prices = ctx.plan, ctx.mesh, ctx.prices
    if plan.cp == 1 or not has_attention(graph):
        return AxisCost()
    cp_ranks = mesh.group(Axis.CP.value)
    att_f, att_b = attention_s
    ulysses_n, ring_n = ulysses_and_ring(plan, mesh, prices.cluster.nvlink_domain)
    shape = CpShape.of(ctx, graph, ulysses_n)
    out: list[Comm] = []
    exp_f = exp_b = 0.0
    if ulysses_n > 1:
        t, records = _ulysses(prices, shape, tuple(cp_ranks[:ulysses_n]))
        out += records
        exp_f += t
        exp_b += t
    if ring_n > 1:
        chunk = shape.ring_bytes
        hop, _ = prices.slowest_hop(chunk, cp_ranks[::ulysses_n], closed=True)
        launch_f, launch_b = (prices.profile.overhead_s * _kernels(graph, p) for p in ("forward", "backward"))
        fwd, bwd = (ring_n - 1) * (hop + launch_f), (ring_n - 1) * (2 * hop + launch_b)
        hide = prices.params.cp_overlap            # share of attention the hops hide behind (1 at the point)
        e_f = (ring_n - 1) * (max(0.0, hop - hide * att_f / ring_n) + launch_f)
        e_b = (ring_n - 1) * (max(0.0, 2 * hop - hide * att_b / ring_n) + launch_b)
        ring = tuple(cp_ranks[::ulysses_n])
        out.append(Comm(Axis.CP.value, "p2p", chunk, fwd, e_f, "forward", calls=ring_n - 1, purpose="ring",
                        ranks=ring))
        out.append(Comm(Axis.CP.value, "p2p", chunk, bwd, e_b, "backward", calls=2 * (ring_n - 1), purpose="ring",
                        ranks=ring))
        exp_f += e_f
        exp_b += e_b
    return AxisCost(exp_f, exp_b, tuple(out))
