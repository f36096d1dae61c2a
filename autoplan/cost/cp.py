"""Context parallelism: attention's sequence split over the cp axis, ring, Ulysses or both (USP).

Per micro-batch and GPU, for a block with attention (bf16 activations; s = sequence, b = mbs,
a_kv = KV heads, d = head dim, h = hidden, n = cp):

* **ring** (Liu et al. 2023, Megatron-Core ``--context-parallel-size``): each of the n−1 hops
  passes this rank's K and V chunk, ``2·b·(s/n)·a_kv·d·2/tp`` bytes, P2P to the next rank;
  forward n−1 hops, backward 2·(n−1) (K/V again and their gradients).  All ranks send at
  once, so a hop takes the ring's slowest (the wrap-around included).  The pass runs as n
  steps, each an attention kernel on one K/V chunk (load-balanced chunks: every step 1/n of
  the rank's work c) overlapping the next hop h: the pass takes (n−1)·max(c/n, h) + c/n, so
  exposed = (n−1)·(max(0, h − c/n) + k), k being the launch of the extra kernels per step
  (counted in the ring's time with its hops).
* **Ulysses** (Jacobs et al. 2023): q, k, v and the output are re-sharded heads↔sequence with
  one all-to-all each (4 per pass, ``b·(s/n)·h·2/tp`` bytes per rank), on the critical path.
* **USP** (Fang & Zhao 2024): Ulysses over u ranks inside the NVLink domain, ring over r = n/u
  across.  After the all-to-all a rank holds s/r tokens of a_kv/u KV heads, so a ring hop passes
  ``2·b·(s/r)·(a_kv/u)·d·2/tp`` = the ring's own chunk at cp = n, not u times it.

Attention's time per phase is what its kernels execute (``attention_seconds``): the forward
kernel's and the backward kernel's FLOPs as traced (flash backward = 2.5× forward: Dao 2023,
§3.1, 5 GEMMs vs 2, the frontend's count), at the fraction of them a causal kernel computes
(``opkinds.attention_work_fraction``), each at its own efficiency.
"""
from __future__ import annotations

from autoplan.axes import Axis
from autoplan.cost.comms import Comms
from autoplan.cost.types import AxisCost, Comm
from autoplan.ir import ModelInfo, OpGraph
from autoplan.mesh import Mesh
from autoplan.opkinds import attention_work_fraction, has_attention, is_attention_core, is_attention_kernel, op_kind
from autoplan.plan import Plan
from autoplan.rules import ulysses_and_ring

ACTIVATION_BYTES = 2                    # bf16
ULYSSES_ALL_TO_ALLS = 4                 # q, k, v and the output, per pass


def attention_seconds(comms: Comms, graph: OpGraph, plan: Plan) -> tuple[float, float]:
    """(forward, backward) compute seconds of the attention core (kernels and s×s score ops),
    per micro-batch, per GPU: the kernels' real work (causal tiles only) on 1/cp of the sequence."""
    out = {"forward": 0.0, "backward": 0.0}
    for n in graph.ops():
        if is_attention_core(n):
            gemm = None
            if n.gemm:
                m, nn, k = n.gemm
                gemm = (m * plan.mbs / plan.cp, nn, k)
            scale = plan.mbs / plan.cp / plan.tp
            out[n.phase] += comms.op_seconds(op_kind(n), n.flops * scale * attention_work_fraction(n),
                                             (n.bytes_read + n.bytes_written) * scale, gemm)
    return out["forward"], out["backward"]


def _kernels(graph: OpGraph, phase: str) -> int:
    return sum(1 for n in graph.ops(phase) if is_attention_kernel(n))


def cp_cost(comms: Comms, info: ModelInfo, seq_len: int, hidden: int, graph: OpGraph, plan: Plan, mesh: Mesh,
            attention_s: tuple[float, float]) -> AxisCost:
    """Exposed forward/backward seconds of context parallelism for one graph, and its collectives."""
    if plan.cp == 1 or not has_attention(graph):
        return AxisCost()
    cp_ranks = mesh.group(Axis.CP.value)
    kv_heads = info.kv_heads or info.heads
    head_dim = info.head_dim or (hidden // max(info.heads, 1))
    tokens = plan.mbs * seq_len / plan.cp
    kv_bytes = 2 * tokens * kv_heads * head_dim * ACTIVATION_BYTES / plan.tp    # K and V chunk
    qo_bytes = tokens * hidden * ACTIVATION_BYTES / plan.tp                      # one of q/k/v/o, per-rank send
    att_f, att_b = attention_s
    ulysses_n, ring_n = ulysses_and_ring(plan, mesh, comms.cluster.nvlink_domain)
    out: list[Comm] = []
    exp_f = exp_b = 0.0
    if ulysses_n > 1:
        t = ULYSSES_ALL_TO_ALLS * comms.collective("all_to_all", qo_bytes, cp_ranks[:ulysses_n])
        for phase in ("forward", "backward"):
            out.append(Comm(Axis.CP.value, "all_to_all", qo_bytes, t, t, phase, calls=ULYSSES_ALL_TO_ALLS,
                            purpose="ulysses", ranks=tuple(cp_ranks[:ulysses_n])))
        exp_f += t
        exp_b += t
    if ring_n > 1:
        chunk = kv_bytes            # (s/r tokens)·(a_kv/u heads) after the all-to-all = (s/n)·a_kv
        hop, _ = comms.slowest_hop(chunk, cp_ranks[::ulysses_n], closed=True)
        launch_f, launch_b = (comms.profile.overhead_s * _kernels(graph, p) for p in ("forward", "backward"))
        fwd, bwd = (ring_n - 1) * (hop + launch_f), (ring_n - 1) * (2 * hop + launch_b)
        hide = comms.params.cp_overlap            # share of attention the hops hide behind (1 at the point)
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
