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
* **ring steps**: beside its hops, a ring runs work a single attention kernel over the whole
  sequence does not, on the compute stream (``ring_step_seconds``, ``AxisCost.compute_*``), read
  from Transformer Engine's ``AttnFuncWithCP`` (v1.4, Megatron-Core's ring): each of the n − 1
  non-local steps merges its partial output into the running one (out += out_i·exp(lse_i − lse)),
  copies the half of q or of K/V its kernel reads, and in backward runs a flash backward of its
  own (its dot(do, o) pass and fp32 dq accumulator), adds its dq into dq and its dK/dV into the
  travelling dK/dV — HBM traffic counted per element of q and of K/V (``RING_*``, the causal
  ring's half-chunk steps averaged) at the memory roofline; and its kernels run on chunks, the
  local one s/r × s/r and the others s/r × s/2r (s/r the tokens a rank holds), each dim at the
  efficiency L / (L + gemm_half_dim) of the GEMM curve against the whole sequence's s × s.
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

# HBM bytes per element a ring step other than the local one moves beyond its attention kernel
# (Transformer Engine's ``AttnFuncWithCP``, v1.4, Megatron-Core's ring; module docstring), in
# elements of q (= o, do, dq) and of k and v together, as multiples of their element size e, the
# causal ring's half-chunk steps averaged (half of the steps touch half of q or of k and v):
RING_FWD_Q = 0.75 * 3 + 0.5     # out += out_step·exp(lse_step − lse) (read both, write out); a half-q copy
RING_FWD_KV = 0.5               # a half-kv copy
RING_BWD_Q = 0.75 * (2 + 1 + 3) + 1.5   # flash bwd's dot(do, o) (2) and dq cast (1); dq += dq_step (3);
                                        # half-q, -o, -do copies
RING_BWD_Q_FP32 = 0.75 * 8.0    # flash bwd's fp32 dq accumulator: zeroed (4), read by the cast (4)
RING_BWD_KV = 0.75 * 3 + 0.5    # dkv += dkv_step (read both, write); a half-kv copy
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

    qo_bytes: float          # one of q / o (and their gradients): b·(s/n)·(a/tp)·d·e_q, d: (d_qk + d_v)/2
    kv_a2a_bytes: float      # one of k / v in Ulysses' all-to-all: b·(s/n)·max(a_kv/tp, u)·d·e_kv
    ring_bytes: float        # K and V of a ring hop: 2·b·(s/n)·max(a_kv/tp, u)·d·e_kv
    q_elem: float = 2.0      # bytes per element of q (and o) as the attention kernel reads them
    kv_elem: float = 2.0     # of k (and v)

    @staticmethod
    def of(ctx: PlanContext, graph: OpGraph, ulysses: int) -> CpShape:
        """The shape of ``ctx.plan``'s sends for ``graph`` with ``ulysses`` ranks in each Ulysses
        group, at the element sizes the graph's attention reads (``attention_bytes``)."""
        info, plan = ctx.model, ctx.plan
        q_elem, kv_elem = attention_bytes(graph)
        heads = max(info.heads, 1)
        head_dim = info.head_dim or ctx.hidden // heads
        # q and k have head_dim, o and v the value head (MLA: 192 and 128): the pairs sent as often
        # (q with o, k with v) are priced at their mean width
        pair_dim = (head_dim + (info.v_head_dim or head_dim)) / 2
        tokens = plan.mbs * ctx.seq_len / plan.cp
        # KV heads on a tp rank (Megatron replicates them when tp > a_kv), then on a Ulysses rank
        # at least one: fewer than u are replicated to u before the all-to-all (Megatron, USP)
        kv = max((info.kv_heads or heads) / plan.tp, 1.0, float(ulysses))
        return CpShape(tokens * heads * pair_dim * q_elem / plan.tp,
                       tokens * kv * pair_dim * kv_elem, 2 * tokens * kv * pair_dim * kv_elem, q_elem, kv_elem)


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


def chunk_efficiency(length: float, half: float) -> float:
    """The efficiency factor of an attention kernel along one sequence dim of ``length`` tokens:
    ``L / (L + half)``, the GEMM curve's (``ComputeProfile.gemm_efficiency``) with its
    ``gemm_half_dim`` — a flash kernel is two tiled GEMMs per tile (QKᵀ along the keys, PV along
    the queries), each tile paying the load of its Q (or K, V) block and the write of its output."""
    return length / (length + half)


def ring_step_seconds(ctx: PlanContext, shape: CpShape, ring_n: int,
                      attention_s: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that a ring of ``ring_n`` steps adds on the
    compute stream beside its hops (module docstring, *ring steps*): the merge and accumulation
    traffic of its n − 1 extra steps, and its kernels' efficiency on chunks."""
    prices = ctx.prices
    q_elem, kv_elem = shape.q_elem, shape.kv_elem
    steps = ring_n - 1
    e_q = shape.qo_bytes / q_elem                 # elements of the rank's q (= o, dq, do)
    e_kv = shape.ring_bytes / kv_elem             # of its k and v together
    traffic_f = steps * (e_q * RING_FWD_Q * q_elem + e_kv * RING_FWD_KV * kv_elem)
    traffic_b = steps * (e_q * (RING_BWD_Q * q_elem + RING_BWD_Q_FP32) + e_kv * RING_BWD_KV * kv_elem)
    merge_f = prices.op_seconds("cast", 0.0, traffic_f, None) if steps else 0.0
    merge_b = prices.op_seconds("cast", 0.0, traffic_b, None) if steps else 0.0
    # a rank holds s/r tokens (USP: after its Ulysses all-to-all); every step but the local one
    # runs a (full × half chunk) kernel, the local one (full × full), against one kernel over the
    # whole sequence: the work the attention seconds price
    half = prices.profile.gemm_half_dim
    s = ctx.seq_len
    whole = chunk_efficiency(s, half) ** 2
    full = s / ring_n
    local = whole / chunk_efficiency(full, half) ** 2 - 1.0
    other = whole / (chunk_efficiency(full, half) * chunk_efficiency(full / 2, half)) - 1.0
    slow = (local + steps * other) / ring_n
    att_f, att_b = attention_s
    return merge_f + slow * att_f, merge_b + slow * att_b


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
    exp_f = exp_b = step_f = step_b = 0.0
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
        step_f, step_b = ring_step_seconds(ctx, shape, ring_n, attention_s)
        e_f = (ring_n - 1) * (max(0.0, hop - hide * att_f / ring_n) + launch_f)
        e_b = (ring_n - 1) * (max(0.0, 2 * hop - hide * att_b / ring_n) + launch_b)
        ring = tuple(cp_ranks[::ulysses_n])
        out.append(Comm(Axis.CP.value, "p2p", chunk, fwd, e_f, "forward", calls=ring_n - 1, purpose="ring",
                        ranks=ring))
        out.append(Comm(Axis.CP.value, "p2p", chunk, bwd, e_b, "backward", calls=2 * (ring_n - 1), purpose="ring",
                        ranks=ring))
        exp_f += e_f
        exp_b += e_b
    return AxisCost(exp_f, exp_b, tuple(out), step_f, step_b)
