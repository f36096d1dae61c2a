"""MoE token dispatch: where a token's experts sit, the busiest rank's load, and one transfer's seconds.

An MoE layer sends every token to the ranks holding its top-k experts (dispatch) and the
results back (combine); backward runs the same two transfers the other way.  Two kinds of
engine are priced:

* **all-to-all** (Megatron-Core's ``alltoall`` dispatcher, torchtitan): the permuted rows, one
  per (token, expert) choice, go through one NCCL all-to-all over the EP group: T·k rows of
  h·e bytes per rank, copies to experts on the same rank or node included
  (``costmodels.collectives``' all_to_all on the group's real ranks).
* **hierarchical** (DeepEP's normal kernels, Megatron-Core's ``flex`` dispatcher with DeepEP or
  HybridEP): a token goes once to each rank that holds one of its experts (rank dedup); across
  NVLink domains it crosses the network once per target domain, to the GPU of its own rail
  there, which forwards it over NVLink to the target ranks of that domain (domain dedup).  The
  two hops are pipelined (DeepEP's forwarder warps), so a transfer lasts as long as the slower
  of the RDMA bytes on the GPU's NIC and the NVLink bytes into the GPU, plus one step of
  latency of each (``hierarchical_seconds``).  DeepEP's README measures the normal kernels at
  153–158 GB/s of NVLink on H800 (~160 GB/s achievable: the ring efficiency of
  ``topologies/network.yaml``) and 43–58 GB/s of RDMA on a 400 Gb/s NIC (~50 GB/s: NCCL's NIC
  efficiency), the rates used here.

**Where a token's experts sit** (``units_hit``): experts are numbered so that each EP rank holds
E/ep consecutive ones (Megatron-Core's expert placement) and each NVLink domain the experts of
its ranks.  Routing is priced balanced (uniformly random among the experts a token may use),
as the published MoE benchmarks run it (Megatron-Core's ``--moe-router-force-load-balancing``,
Megatron-Bridge's MoE perf recipes: "force-balance routing"); with group-limited routing
(DeepSeek-V3: 256 experts in 8 groups, a token's experts from its best 4 groups, so at most 4
nodes when a group is a node) a token first draws ``topk_groups`` of ``groups`` groups, then k
experts among theirs.  The expected number of units (ranks or domains) a token reaches follows
by counting (hypergeometric over groups, then without-replacement draws of k experts).

**The busiest rank** (``busiest_load``): a dispatch and a combine end when the rank that
receives the most rows is done, and so does the grouped GEMM between them.  Under balanced
routing the rows a rank receives are binomial around their mean μ = T·k (T tokens per rank):
the expected maximum over ep ranks is μ + z(ep)·σ, σ = √(μ·(1 − 1/ep)) and z(n) the expected
maximum of n standard normals (Blom's approximation through ``NormalDist``), so
max/mean = 1 + z(ep)·√((1 − 1/ep)/μ): 1.6 % for Qwen3-235B's T·k = 16,384 on EP32.  That is
what a forced-balance benchmark sees; an aux-loss-free dropless run (DeepSeek-V3) is less even,
which the planner does not price (its plans are what forced balance gives).
"""
from __future__ import annotations

import math
from statistics import NormalDist

from topologies import Cluster, GroupSpan


def _miss(candidates: int, held: int, k: int) -> float:
    """Probability that k draws without replacement from ``candidates`` experts miss the
    ``held`` of them a unit holds."""
    if held <= 0:
        return 1.0
    if candidates - held < k:
        return 0.0
    p = 1.0
    for i in range(k):
        p *= (candidates - held - i) / (candidates - i)
    return p


def unit_hit_probability(k: int, experts: int, unit: int, groups: int = 1, topk_groups: int = 0) -> float:
    """Probability that one token's top-k reaches a given unit (a rank or an NVLink domain) that
    holds ``unit`` consecutive experts of ``experts``, under balanced (group-limited when
    ``topk_groups`` < ``groups``) routing (module docstring)."""
    k = min(k, experts)
    if groups <= 1 or not topk_groups or topk_groups >= groups:
        return 1.0 - _miss(experts, unit, k)
    size = experts // groups                          # experts per group
    candidates = topk_groups * size
    if unit < size:                                   # inside one group: its group must be drawn
        return topk_groups / groups * (1.0 - _miss(candidates, unit, k))
    held = unit // size                               # whole groups in the unit
    total = math.comb(groups, topk_groups)
    p = 0.0
    for j in range(1, min(held, topk_groups) + 1):    # j of the unit's groups drawn (hypergeometric)
        pj = math.comb(held, j) * math.comb(groups - held, topk_groups - j) / total
        p += pj * (1.0 - _miss(candidates, j * size, k))
    return p


def units_hit(k: int, experts: int, units: int, groups: int = 1, topk_groups: int = 0) -> float:
    """Expected number of distinct units, of ``units`` equal ones, one token's top-k reaches."""
    return units * unit_hit_probability(k, experts, experts // units, groups, topk_groups)


def expected_max_normal(n: int) -> float:
    """Expected maximum of n independent standard normals (Blom: Φ⁻¹((n − 0.375)/(n + 0.25)))."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def busiest_load(rows_per_rank: float, ep: int) -> float:
    """max/mean of the rows the ep ranks of an EP group receive under balanced routing (module
    docstring): 1 + z(ep)·√((1 − 1/ep)/μ), μ = ``rows_per_rank``."""
    if ep <= 1 or rows_per_rank <= 0:
        return 1.0
    return 1.0 + expected_max_normal(ep) * math.sqrt((1.0 - 1.0 / ep) / rows_per_rank)


def hierarchical_bytes(tokens: float, row_bytes: float, k: int, experts: int, ep: int, span: GroupSpan,
                       groups: int = 1, topk_groups: int = 0) -> tuple[float, float]:
    """(network bytes out of a GPU, NVLink bytes into a GPU) of one hierarchical dispatch of
    ``tokens`` rows of ``row_bytes`` each over an EP group of ``ep`` ranks spread as ``span``
    (module docstring).  Inside one NVLink domain there are no network bytes and each token goes
    once to every other rank it reaches; across domains it crosses the network once per other
    domain it reaches, and enters each rank it reaches over NVLink once."""
    per_rank = experts // ep
    p_rank = unit_hit_probability(k, experts, per_rank, groups, topk_groups)
    if span.domains <= 1:
        return 0.0, tokens * row_bytes * (ep - 1) * p_rank
    per_domain = per_rank * span.gpus_per_domain
    p_domain = unit_hit_probability(k, experts, per_domain, groups, topk_groups)
    return tokens * row_bytes * (span.domains - 1) * p_domain, tokens * row_bytes * ep * p_rank


def hierarchical_seconds(network_bytes: float, nvlink_bytes: float, span: GroupSpan, cluster: Cluster) -> float:
    """Seconds of one hierarchical dispatch (or combine) moving ``network_bytes`` out of each GPU's
    NIC and ``nvlink_bytes`` into it over NVLink: the slower hop, pipelined with the other, plus
    a launch and one step of latency per level crossed."""
    nvlink = nvlink_bytes / (cluster.gpu.nvlink_bw * cluster.nvlink_efficiency)
    latency = cluster.launch_latency + cluster.nvlink_latency
    if span.domains <= 1:
        return nvlink + latency
    per_gpu = cluster.node_network_bw / max(cluster.gpus_per_node, 1)
    network = network_bytes / per_gpu
    return max(nvlink, network) + latency + cluster.level_latency(span.level)
