"""The cluster model: GPUs in nodes, NVLink domains, rail groups, pods; and communication spans.

Levels, innermost first (each one a set of consecutive ranks)::

    node           gpus_per_node GPUs sharing nics_per_node NICs (a server, or a GB200 tray)
    NVLink domain  nvlink_domain GPUs on one NVSwitch fabric (8 on HGX; 72 on NVL72, 18 trays)
    rail group     leaf_nodes nodes whose GPU i all hang off rail leaf switch i (a SuperPOD SU)
    pod            pod_size GPUs under one non-blocking leaf/spine fabric
    cluster        pods joined by a core tier oversubscribed pod_oversubscription : 1

Rank layout: rank ``r`` lives on node ``r // gpus_per_node``, NVLink domain
``r // nvlink_domain``, rail group ``r // (leaf_nodes * gpus_per_node)`` and pod
``r // pod_size``.  The last rail group or pod may be partial.

A communication group is described by ``Cluster.span(ranks) -> GroupSpan``; its ``level`` is the
outermost level the group crosses:

    "nvlink"  all members in one NVLink domain
    "rail"    several NVLink domains, one rail group (one leaf switch hop)
    "spine"   several rail groups inside one pod (leaf - spine - leaf)
    "pod"     several pods (through the core tier and its oversubscription)

This module knows no prices: bandwidth and latency *parameters* live here, the formulas that
turn them into seconds live in ``costmodels.collectives``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from topologies.gpus import GPUSpec

LEVELS = ("nvlink", "rail", "spine", "pod")
"""Span levels, innermost first."""


@dataclasses.dataclass(frozen=True)
class GroupSpan:
    """Where the members of one communication group sit on a cluster.

    Counts are over the group's members only.  ``gpus_per_node`` / ``gpus_per_domain`` /
    ``gpus_per_pod`` are maxima over nodes / domains / pods (equal to the mean for the uniform
    groups a device mesh produces).
    """

    size: int
    """Number of ranks in the group."""
    nodes: int
    """Distinct nodes the group touches."""
    gpus_per_node: int
    """Most group members on one node (k in the collective formulas for NIC sharing)."""
    domains: int
    """Distinct NVLink domains the group touches."""
    gpus_per_domain: int
    """Most group members in one NVLink domain."""
    leaves: int
    """Distinct rail groups (leaf switch groups) the group touches."""
    pods: int
    """Distinct pods the group touches."""
    gpus_per_pod: int
    """Most group members in one pod."""
    level: str
    """Outermost level crossed: "nvlink", "rail", "spine" or "pod" (see module docstring)."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A GPU cluster with explicit network levels (see the module docstring for the layout).

    Bandwidths are bytes/s per direction, latencies seconds.  The efficiency and latency fields
    are physical properties of the link kind; their defaults come from ``topologies/network.yaml``.
    """

    name: str
    """Short name, e.g. ``"selene"`` or ``"h100x1024"``."""
    description: str
    """One line for humans."""
    gpu: GPUSpec
    """The GPU kind (every GPU of a cluster is the same kind)."""
    num_gpus: int
    """Total GPUs."""
    gpus_per_node: int
    """GPUs per node (server or compute tray); the unit that shares the node's NICs."""
    nvlink_domain: int
    """GPUs per NVLink domain: 8 for an HGX node, 72 for a GB200 NVL72 rack (18 trays)."""
    nics_per_node: int
    """Compute-fabric NICs per node (storage / front-end NICs are not modelled)."""
    nic: str
    """NIC kind from network.yaml, e.g. ``"ndr400"`` (for display; the numbers are below)."""
    nic_bw: float
    """Line rate of one NIC, bytes/s per direction (400 Gb/s = 50e9)."""
    nic_efficiency: float
    """Fraction of ``nic_bw`` NCCL achieves through one NIC (0.94 for NDR 400G: ~47 of 50 GB/s)."""
    fabric: str
    """Scale-out fabric name for display: ``"IB"`` or ``"RoCE"``."""
    leaf_nodes: int
    """Nodes per rail group: nodes whose GPUs share the rail leaf switches (one SU)."""
    pod_size: int
    """GPUs per pod: one non-blocking leaf/spine fabric."""
    pod_oversubscription: float
    """Oversubscription of the tier above the pods, x in 1:x (1.0 = non-blocking, 7.0 = 1:7)."""
    nvls: bool
    """NVLink SHARP (in-switch all-reduce) available in the NVLink domain."""
    sharp: bool
    """InfiniBand SHARP (in-network all-reduce) available and enabled for NCCL."""
    nvlink_efficiency: float
    """Ring bus bandwidth on NVLink as a fraction of ``gpu.nvlink_bw`` (~370/450)."""
    nvls_efficiency: float
    """NVLS all-reduce: algbw = nvls_efficiency * nvlink_bw * k/(k+1) for k GPUs."""
    launch_latency: float
    """Fixed cost of one collective call, seconds."""
    nvlink_latency: float
    """One algorithm step over NVLink, seconds."""
    rail_latency: float
    """One algorithm step between nodes under one rail leaf switch, seconds."""
    spine_latency: float
    """One algorithm step between rail groups through the spine, seconds."""
    pod_latency: float
    """One algorithm step between pods through the core tier, seconds."""

    def __post_init__(self) -> None:
        # Programming errors only: user input is validated in cluster_yaml before this runs.
        problems = _layout_problems(self)
        if problems:
            raise ValueError(f"cluster {self.name!r}: " + "; ".join(problems))

    # ----- derived sizes -------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node

    @property
    def num_domains(self) -> int:
        return self.num_gpus // self.nvlink_domain

    @property
    def leaf_size(self) -> int:
        """GPUs per rail group."""
        return self.leaf_nodes * self.gpus_per_node

    @property
    def num_pods(self) -> int:
        return -(-self.num_gpus // self.pod_size)

    @property
    def peak_bf16_flops(self) -> float:
        """Whole-cluster dense BF16 peak, FLOP/s."""
        return self.num_gpus * self.gpu.bf16_flops

    @property
    def nic_achieved_bw(self) -> float:
        """What NCCL gets through one NIC, bytes/s per direction."""
        return self.nic_bw * self.nic_efficiency

    @property
    def node_network_bw(self) -> float:
        """Achieved network bandwidth of one node (all its NICs), bytes/s per direction."""
        return self.nics_per_node * self.nic_achieved_bw

    def level_latency(self, level: str) -> float:
        """Latency of one algorithm step at a span level ("nvlink", "rail", "spine", "pod")."""
        return {"nvlink": self.nvlink_latency, "rail": self.rail_latency,
                "spine": self.spine_latency, "pod": self.pod_latency}[level]

    # ----- communication groups ------------------------------------------------------------
    def span(self, ranks: Sequence[int]) -> GroupSpan:
        """Describe the group of global ``ranks`` (distinct, each in ``[0, num_gpus)``)."""
        ranks = tuple(ranks)
        if not ranks:
            raise ValueError("a communication group needs at least one rank")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"duplicate ranks in group {ranks}")
        for r in ranks:
            if not 0 <= r < self.num_gpus:
                raise ValueError(f"rank {r} outside cluster {self.name!r} of {self.num_gpus} GPUs")
        per_node = Counter(r // self.gpus_per_node for r in ranks)
        per_domain = Counter(r // self.nvlink_domain for r in ranks)
        per_pod = Counter(r // self.pod_size for r in ranks)
        leaves = len({r // self.leaf_size for r in ranks})
        if len(per_pod) > 1:
            level = "pod"
        elif leaves > 1:
            level = "spine"
        elif len(per_domain) > 1:
            level = "rail"
        else:
            level = "nvlink"
        return GroupSpan(size=len(ranks), nodes=len(per_node), gpus_per_node=max(per_node.values()),
                         domains=len(per_domain), gpus_per_domain=max(per_domain.values()),
                         leaves=leaves, pods=len(per_pod), gpus_per_pod=max(per_pod.values()),
                         level=level)

    def describe_span(self, span: GroupSpan) -> str:
        """Short text for the link a span uses: "NVLink", "IB rail", "IB spine", "across pods (1:7)"."""
        if span.level == "nvlink":
            return "NVLink" if span.nodes == 1 else f"NVLink ({self.nvlink_domain}-GPU domain)"
        if span.level == "pod":
            ratio = ("non-blocking" if self.pod_oversubscription == 1.0
                     else f"1:{self.pod_oversubscription:g}")
            return f"across pods ({ratio})"
        return f"{self.fabric} {span.level}"

    def describe(self) -> str:
        """A few words on the hardware, e.g. "560 nodes x 8 a100-80gb, 8x hdr200 per node"."""
        pods = ""
        if self.num_pods > 1:
            ratio = ("non-blocking" if self.pod_oversubscription == 1.0
                     else f"1:{self.pod_oversubscription:g}")
            pods = f", {self.num_pods} pods of {self.pod_size} ({ratio})"
        return (f"{self.num_nodes} nodes x {self.gpus_per_node} {self.gpu.name}, NVLink domain "
                f"{self.nvlink_domain}, {self.nics_per_node}x {self.nic} {self.fabric} per node{pods}")


def _layout_problems(c: Cluster) -> list[str]:
    """Inconsistencies in a cluster's sizes; empty when the layout is valid."""
    problems = []
    for field in ("num_gpus", "gpus_per_node", "nvlink_domain", "nics_per_node", "leaf_nodes",
                  "pod_size"):
        if not isinstance(getattr(c, field), int) or getattr(c, field) < 1:
            problems.append(f"{field} must be a positive integer, got {getattr(c, field)!r}")
    if problems:
        return problems
    if c.nvlink_domain % c.gpus_per_node:
        problems.append(f"nvlink_domain ({c.nvlink_domain}) must be a multiple of gpus_per_node "
                        f"({c.gpus_per_node})")
    if c.num_gpus % c.nvlink_domain:
        problems.append(f"num_gpus ({c.num_gpus}) must be a multiple of nvlink_domain "
                        f"({c.nvlink_domain})")
    if c.leaf_size % c.nvlink_domain:
        problems.append(f"a rail group (leaf_nodes x gpus_per_node = {c.leaf_size}) must hold whole "
                        f"NVLink domains of {c.nvlink_domain}")
    if c.pod_size % c.leaf_size:
        problems.append(f"pod_size ({c.pod_size}) must be a multiple of the rail group size "
                        f"({c.leaf_size} GPUs)")
    if c.pod_oversubscription < 1.0:
        problems.append(f"pod_oversubscription must be >= 1 (1 = non-blocking), got "
                        f"{c.pod_oversubscription}")
    for field in ("nic_efficiency", "nvlink_efficiency", "nvls_efficiency"):
        if not 0.0 < getattr(c, field) <= 1.0:
            problems.append(f"{field} must be in (0, 1], got {getattr(c, field)}")
    for field in ("nic_bw",):
        if getattr(c, field) <= 0:
            problems.append(f"{field} must be positive, got {getattr(c, field)}")
    for field in ("launch_latency", "nvlink_latency", "rail_latency", "spine_latency",
                  "pod_latency"):
        if getattr(c, field) < 0:
            problems.append(f"{field} must be >= 0 seconds, got {getattr(c, field)}")
    return problems
