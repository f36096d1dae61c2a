"""Time of one NCCL-style collective on a cluster: α–β per level, hierarchical, NIC sharing,
oversubscription, NVLS and SHARP.  Pure Python; reads only ``topologies`` objects.

Conventions (those of nccl-tests)
---------------------------------
``nbytes`` (S) is: all_reduce / broadcast: the buffer size; all_gather: the output (full) size;
reduce_scatter: the input (full) size; all_to_all: what one rank sends in total (S/n to each
peer, itself included); p2p: the message size.  For a group of n ranks and a time t:

    algbw = S / t                    busbw = algbw * F(kind, n)
    F = 2(n-1)/n (all_reduce);  (n-1)/n (all_gather, reduce_scatter, all_to_all);  1 (p2p, broadcast)

busbw is comparable with the link bandwidth whatever n is; nccl-tests reports both.

Symbols
-------
n = span.size ranks over m = span.domains NVLink domains, k = n/m ranks per domain (groups built
from a device mesh are uniform; for ragged groups the mean is used).  Cluster parameters:

    B_ring = gpu.nvlink_bw * nvlink_efficiency            NVLink ring busbw per GPU (370 on H100)
    B_nvls(k) = gpu.nvlink_bw * nvls_efficiency * k/(k+1)  NVLS all-reduce algbw over k GPUs
    B_net  = node_network_bw / max(u, min(nics_per_node, gpus_per_node))   network per GPU
    α0 = launch_latency; α_nvl = nvlink_latency; α_L = latency of the span's level (rail/spine/pod)

NIC sharing: u = min(gpus_per_node, span.gpus_per_node * c) GPUs of a node are on the network at
once, where c = ``concurrent_groups_per_node`` (default gpus_per_node // span.gpus_per_node: every
GPU of the node runs the same collective in a parallel group, as the groups of one mesh axis
do).  They share the node's NICs; one GPU alone uses at most its own NIC(s) (rail-local).

Oversubscription: pods are joined by a tier oversubscribed ov = pod_oversubscription : 1, so a
pod's uplink carries pod_size * b_inj / ov, with b_inj = node_network_bw / gpus_per_node the
injection bandwidth per GPU.  A fraction f = u / gpus_per_node of the pod's GPUs is busy (all
nodes alike).
  * Ring / tree phases between domains: the phase is k parallel rail rings, each crossing out of
    a pod once; with m_pod = m / span.pods domains of the group per pod and every busy GPU's
    group doing the same, a pod must push f * pod_size * e / m_pod through its uplinks, e being
    the bytes per GPU of the phase: t_pod = f * e * ov / (m_pod * b_inj).  Rings thus tolerate
    oversubscription when m_pod >= ov (DP across pods), and suffer when groups cross pods thinly.
  * All-to-all: each GPU sends x = S (n - n/pods)/n bytes to other pods: t_pod = f * x * ov / b_inj.
  * P2P across pods: t_pod = f * S * ov / b_inj (every busy GPU of the pod crossing at once: an
    upper bound for pipeline sends, where only the GPUs at a stage boundary cross).
A network phase takes max(e / B_net, t_pod).

Formulas
--------
A phase's bandwidth terms and latency terms are added separately: NCCL pipelines chunks through
the phases of a hierarchical algorithm, so the bandwidth time is that of the bottleneck phase
(max), while every step's latency is paid once (sum).  t = max(bandwidth terms) + Σ latency.

all_reduce, one domain (m = 1): the faster of
    ring:  2(n-1)/n * S / B_ring            + α0 + 2(n-1) α_nvl
    NVLS:  S / B_nvls(n)                    + α0 + 2 α_nvl         (if cluster.nvls)
  NVLS wins from k = 4 on H100 (8x H100: busbw 480 vs 370).
all_reduce, m > 1 domains: the fastest of NCCL's algorithms,
    flat ring over all n ranks (k rings per domain, each leaving on its own rail):
           max(2(n-1)/n * S / B_ring, net(2(n-1)/n * S/k)) + α0 + (2(n-1) - 2m) α_nvl + 2m α_L
           (NCCL's tuning model: 2m network steps); NCCL has no ring-in-domain + ring-across
           hierarchy, which would move only 2(m-1)/m * S/k per GPU (1/1.875 of it at n=16, m=2)
    and the two-level ones, max of an intra and an inter phase:
    intra: ring/chain 2(k-1)/k * S / B_ring (+ 2(k-1) α_nvl) or NVLS S / B_nvls(k) (+ 2 α_nvl)
    inter: tree  e = 2 * S/k          (+ 2 ceil(log2 m) α_L)   NCCL's double binary tree
           ring  e = 2(m-1)/m * S/k   (+ 2(m-1) α_L)           with NVLS only (NCCL's NVLS)
           SHARP e = S/k              (+ 2 α_L)                if cluster.sharp: the switches
                                       reduce, each GPU sends and receives its S/k once
  + α0.  A full node (k = 8) on many nodes reaches busbw ≈ 8 * B_net
  (376 GB/s on 8x 400G, 192 on 8x HDR 200G); k = 1 reaches one NIC (~47 GB/s).
reduce_scatter / all_gather: NCCL's flat ring over all n ranks:
    max((n-1)/n * S / B_ring, net((n-1)/n * S/k)) + α0 + (n-m) α_nvl + (m-1) α_L
broadcast: S split over the k GPUs of each domain, chained between domains, then exchanged in
    the domain: max((k-1)/k * S / B_ring, net(S/k)) + α0 + (k-1) α_nvl + (m-1) α_L
    (m = 1: S / B_ring + α0 + (n-1) α_nvl)
all_to_all: all pairs at once; PXN aggregates the messages to one remote domain into one step:
    max((k-1)/n * S / B_ring, (n-k)/n * S / B_net, t_pod) + α0 + (k-1) α_nvl + (m-1) α_L
p2p: S / B_ring + α0 + α_nvl inside a domain; net(S) + α0 + α_L across domains.

Not modelled: protocol choice (LL / LL128 / Simple) beyond the latency constants; NVLS for
reduce-scatter / all-gather; PAT; congestion between different collectives running at once
(pass ``concurrent_groups_per_node`` to account for NIC sharing).
"""
from __future__ import annotations

import dataclasses
import math

from topologies import Cluster, GroupSpan

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "p2p", "broadcast")


@dataclasses.dataclass(frozen=True)
class CollectiveCost:
    """The priced collective, with the why (for the explainer)."""

    kind: str
    """One of ``KINDS``."""
    nbytes: float
    """Size in nccl-tests convention (see module docstring), bytes."""
    group_size: int
    """Ranks in the group."""
    time_s: float
    """Total time, seconds (bandwidth part + latency part)."""
    latency_s: float
    """The latency part of ``time_s`` (launch + per-step α), seconds."""
    algbw: float
    """nbytes / time_s, bytes/s (0 for an empty or one-rank collective)."""
    busbw: float
    """algbw * nccl-tests bus factor, bytes/s."""
    level: str
    """Outermost level the group crosses: "nvlink", "rail", "spine", "pod"."""
    link: str
    """Human text for that level, e.g. "NVLink", "IB rail", "across pods (1:7)"."""
    algorithm: str
    """e.g. "ring", "nvls", "nvls+ring" (intra + inter phases), "ring+sharp", "pairwise"."""
    bottleneck: str
    """The bandwidth term that set the time: "NVLink", "NIC", "pod uplink", or "none"."""


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for a group of ``n`` ranks."""
    _check_kind(kind)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def alg_bandwidth(nbytes: float, time_s: float) -> float:
    """nccl-tests algbw = nbytes / time, bytes/s."""
    return nbytes / time_s


def bus_bandwidth(kind: str, nbytes: float, n: int, time_s: float) -> float:
    """nccl-tests busbw = algbw * bus_factor(kind, n), bytes/s."""
    return alg_bandwidth(nbytes, time_s) * bus_factor(kind, n)


def collective_time(kind: str, nbytes: float, span: GroupSpan, cluster: Cluster, *,
                    concurrent_groups_per_node: int | None = None) -> float:
    """Seconds for one collective of ``kind`` over ``span`` (see the module docstring)."""
    return collective_cost(kind, nbytes, span, cluster,
                           concurrent_groups_per_node=concurrent_groups_per_node).time_s


def collective_cost(kind: str, nbytes: float, span: GroupSpan, cluster: Cluster, *,
                    concurrent_groups_per_node: int | None = None) -> CollectiveCost:
    """The collective's time and its explanation (see the module docstring for the formulas)."""
    _check_kind(kind)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    link = cluster.describe_span(span)
    if span.size == 1 or nbytes == 0:
        return CollectiveCost(kind, float(nbytes), span.size, 0.0, 0.0, 0.0, 0.0, span.level, link,
                              "none", "none")
    net = _Network(span, cluster, concurrent_groups_per_node)
    candidates = _PRICERS[kind](float(nbytes), span, cluster, net)
    bw_s, lat_s, algorithm, bottleneck = min(candidates, key=lambda c: (c[0] + c[1], c[2]))
    time_s = bw_s + lat_s
    algbw = alg_bandwidth(nbytes, time_s)
    return CollectiveCost(kind=kind, nbytes=float(nbytes), group_size=span.size, time_s=time_s,
                          latency_s=lat_s, algbw=algbw, busbw=algbw * bus_factor(kind, span.size),
                          level=span.level, link=link, algorithm=algorithm, bottleneck=bottleneck)


# ----- the network between NVLink domains --------------------------------------------------------

class _Network:
    """Per-GPU network bandwidth and pod-uplink pricing for one span (module docstring symbols)."""

    def __init__(self, span: GroupSpan, cluster: Cluster, concurrent: int | None) -> None:
        gpn = cluster.gpus_per_node
        if concurrent is None:
            concurrent = max(1, gpn // span.gpus_per_node)
        if not isinstance(concurrent, int) or concurrent < 1:
            raise ValueError(f"concurrent_groups_per_node must be a positive int, got {concurrent!r}")
        busy = min(gpn, span.gpus_per_node * concurrent)                        # u
        self.per_gpu = cluster.node_network_bw / max(busy, min(cluster.nics_per_node, gpn))
        self.injection = cluster.node_network_bw / gpn                          # b_inj
        self.busy_fraction = busy / gpn                                         # f
        self.pods = span.pods
        self.domains_per_pod = span.domains / span.pods                         # m_pod
        self.oversubscription = cluster.pod_oversubscription
        self.step_latency = cluster.level_latency(span.level) if span.domains > 1 else 0.0

    def ring_phase(self, bytes_per_gpu: float) -> tuple[float, str]:
        """Seconds for a rail-ring (or tree) phase moving ``bytes_per_gpu`` per GPU, + bottleneck."""
        t_nic = bytes_per_gpu / self.per_gpu
        if self.pods == 1:
            return t_nic, "NIC"
        t_pod = (self.busy_fraction * bytes_per_gpu * self.oversubscription
                 / (self.domains_per_pod * self.injection))
        return (t_pod, "pod uplink") if t_pod > t_nic else (t_nic, "NIC")

    def cross_pod(self, bytes_per_gpu: float) -> float:
        """Seconds for every busy GPU to push ``bytes_per_gpu`` through its pod's uplinks."""
        if self.pods == 1:
            return 0.0
        return self.busy_fraction * bytes_per_gpu * self.oversubscription / self.injection


def _slowest(*terms: tuple[float, str]) -> tuple[float, str]:
    """The largest bandwidth term (seconds, name); ties keep the first (innermost)."""
    best = (0.0, "none")
    for term in terms:
        if term[0] > best[0]:
            best = term
    return best


def _b_ring(cluster: Cluster) -> float:
    return cluster.gpu.nvlink_bw * cluster.nvlink_efficiency


def _b_nvls(cluster: Cluster, k: float) -> float:
    return cluster.gpu.nvlink_bw * cluster.nvls_efficiency * k / (k + 1.0)


# ----- one pricer per kind: each returns candidates (bandwidth_s, latency_s, algorithm, bottleneck)

Candidate = tuple[float, float, str, str]


def _all_reduce(s: float, span: GroupSpan, cluster: Cluster, net: _Network) -> list[Candidate]:
    n, m = span.size, span.domains
    k = n / m
    a0, a_nvl = cluster.launch_latency, cluster.nvlink_latency
    intra = []  # (bandwidth_s, latency_s, name)
    if k > 1:
        intra.append((2 * (k - 1) / k * s / _b_ring(cluster), 2 * (k - 1) * a_nvl, "ring"))
        if cluster.nvls:
            intra.append((s / _b_nvls(cluster, k), 2 * a_nvl, "nvls"))
    if m == 1:
        return [(bw, a0 + lat, name, "NVLink") for bw, lat, name in intra]
    if not intra:
        intra.append((0.0, 0.0, ""))
    # NCCL's algorithms across domains: a flat ring over all n ranks, the tree (a chain in the
    # domain, double binary trees between domains), NVLS / NVLS-tree (reduce-scatter in the domain
    # by NVLS, S/k per GPU across, all-gather by NVLS), CollNet (SHARP).  NCCL has no
    # ring-in-the-domain + ring-across hierarchy: that is the flat ring's traffic only for k = 1.
    inter = [(2 * s / k, 2 * math.ceil(math.log2(m)) * net.step_latency, "tree")]
    if cluster.sharp:
        inter.append((s / k, 2 * net.step_latency, "sharp"))
    out = [_flat_ring(s, span, cluster, net, 2.0)]
    for bw_in, lat_in, name_in in intra:
        for bytes_out, lat_out, name_out in inter + ([(2 * (m - 1) / m * s / k, 2 * (m - 1) * net.step_latency,
                                                      "ring")] if name_in == "nvls" else []):
            bw, bottleneck = _slowest((bw_in, "NVLink"), net.ring_phase(bytes_out))
            name = f"{name_in}+{name_out}" if name_in else name_out
            out.append((bw, a0 + lat_in + lat_out, name, bottleneck))
    return out


def _flat_ring(s: float, span: GroupSpan, cluster: Cluster, net: _Network, passes: float) -> Candidate:
    """NCCL's ring over all n ranks across m domains (``passes`` = 2 for all-reduce, 1 for
    reduce-scatter / all-gather): every GPU sends passes·(n−1)/n·S, NVLink hops inside a domain
    and, with the k rings of a domain leaving it on k rails, passes·(n−1)/n·S/k per GPU on the
    network.  Latency as NCCL's tuning model counts it: passes·m inter-domain steps (passes·(m−1)
    for one pass) at the level's latency, the other steps at NVLink's."""
    n, m = span.size, span.domains
    k = n / m
    traffic = passes * (n - 1) / n * s
    bw, bottleneck = _slowest((traffic / _b_ring(cluster), "NVLink"), net.ring_phase(traffic / k))
    inter = passes * m if passes > 1 else m - 1
    steps = passes * (n - 1)
    lat = cluster.launch_latency + (steps - inter) * cluster.nvlink_latency + inter * net.step_latency
    return bw, lat, "ring", bottleneck


def _ring_gather(s: float, span: GroupSpan, cluster: Cluster, net: _Network) -> list[Candidate]:
    """reduce_scatter and all_gather: the same traffic in opposite directions."""
    n, m = span.size, span.domains
    k = n / m
    intra = ((k - 1) / k * s / _b_ring(cluster), "NVLink")
    lat = cluster.launch_latency + (k - 1) * cluster.nvlink_latency
    if m == 1:
        return [(intra[0], lat, "ring", "NVLink")]
    return [_flat_ring(s, span, cluster, net, 1.0)]


def _broadcast(s: float, span: GroupSpan, cluster: Cluster, net: _Network) -> list[Candidate]:
    n, m = span.size, span.domains
    k = n / m
    a0, a_nvl = cluster.launch_latency, cluster.nvlink_latency
    if m == 1:
        return [(s / _b_ring(cluster), a0 + (n - 1) * a_nvl, "ring", "NVLink")]
    bw, bottleneck = _slowest(((k - 1) / k * s / _b_ring(cluster), "NVLink"), net.ring_phase(s / k))
    return [(bw, a0 + (k - 1) * a_nvl + (m - 1) * net.step_latency, "ring", bottleneck)]


def _all_to_all(s: float, span: GroupSpan, cluster: Cluster, net: _Network) -> list[Candidate]:
    n, m = span.size, span.domains
    k = n / m
    per_pod = n / span.pods
    bw, bottleneck = _slowest(((k - 1) / n * s / _b_ring(cluster), "NVLink"),
                              ((n - k) / n * s / net.per_gpu, "NIC"),
                              (net.cross_pod((n - per_pod) / n * s), "pod uplink"))
    lat = cluster.launch_latency + (k - 1) * cluster.nvlink_latency + (m - 1) * net.step_latency
    return [(bw, lat, "pairwise", bottleneck)]


def _p2p(s: float, span: GroupSpan, cluster: Cluster, net: _Network) -> list[Candidate]:
    if span.domains == 1:
        return [(s / _b_ring(cluster), cluster.launch_latency + cluster.nvlink_latency, "direct",
                 "NVLink")]
    bw, bottleneck = _slowest((s / net.per_gpu, "NIC"), (net.cross_pod(s), "pod uplink"))
    return [(bw, cluster.launch_latency + net.step_latency, "direct", bottleneck)]


_PRICERS = {"all_reduce": _all_reduce, "reduce_scatter": _ring_gather, "all_gather": _ring_gather,
            "broadcast": _broadcast, "all_to_all": _all_to_all, "p2p": _p2p}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}")
