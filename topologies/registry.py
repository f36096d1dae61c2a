"""Finding a cluster by name: bundled YAML files, the ``<gpu>x<N>`` shorthand, or a file path.

``load(name_or_path)`` tries, in order:

1. a path to a YAML file (anything ending in ``.yaml``/``.yml`` or containing a ``/``);
2. a named cluster: ``topologies/clusters/<name>.yaml``;
3. the shorthand ``<gpu>x<N>`` (grammar below);

and otherwise raises ``TopologyError`` listing the named clusters and the grammar.

Shorthand grammar: ``<gpu>x<N>``, where ``<gpu>`` is a GPU kind or alias from gpus.yaml
(``a100``, ``a100-40gb``, ``a100-80gb``, ``h100``, ``h800``, ``h200``, ``b200``, ``gb200``, ``b300``,
``gb300``) and
``<N>`` is the number of GPUs, a multiple of the kind's NVLink domain (8; 72 for ``gb200`` and
``gb300``), or on an NVL72 kind an equal share of whole trays of the fewest racks that hold it
(``rack_share``).  The cluster is the kind's reference system from systems.yaml, N GPUs of it,
non-blocking: ``h100x1024`` is 128 DGX H100 nodes with 8x 400 Gb/s rails; ``gb200x576`` is 8
NVL72 racks; ``gb200x256`` is 4 racks with 64 GPUs (16 trays) of each, their NVLink domain 64.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from topologies._data import DATA_DIR, read_yaml
from topologies.cluster import Cluster
from topologies.cluster_yaml import from_mapping, read_file
from topologies.errors import TopologyError
from topologies.gpus import gpu_names, gpu_spec

CLUSTERS_DIR = DATA_DIR / "clusters"
SHORTHAND = re.compile(r"^(?P<gpu>[a-z0-9][a-z0-9-]*)x(?P<n>[0-9]+)$")
GRAMMAR = ("<gpu>x<N>, e.g. h100x1024, a100x3072, gb200x576, gb200x256 (<gpu> one of "
           "{gpus}; N a multiple of the NVLink domain: 8, or 72 for gb200/gb300, or on those an "
           "equal share of whole 4-GPU trays per rack)")


def named_cluster_names() -> list[str]:
    """Names of the bundled clusters (topologies/clusters/*.yaml), sorted."""
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))


def named_clusters() -> list[Cluster]:
    """Every bundled cluster, sorted by name."""
    return [_load_file(CLUSTERS_DIR / f"{name}.yaml") for name in named_cluster_names()]


def load(name_or_path: str) -> Cluster:
    """The cluster for a bundled name, a ``<gpu>x<N>`` shorthand, or a cluster YAML path."""
    text = name_or_path.strip()
    if text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise TopologyError(f"cluster file {text!r} not found",
                                "give an existing YAML file, a cluster name or <gpu>x<N>")
        return _load_file(path)
    key = text.lower()
    if key in named_cluster_names():
        return _load_file(CLUSTERS_DIR / f"{key}.yaml")
    match = SHORTHAND.match(key)
    if match:
        return shorthand(match.group("gpu"), int(match.group("n")), name=key)
    raise TopologyError(
        f"unknown cluster {name_or_path!r}",
        f"use a named cluster ({', '.join(named_cluster_names())}), the shorthand "
        f"{GRAMMAR.format(gpus=', '.join(gpu_names()))}, or a path to a cluster YAML file")


def shorthand(gpu: str, num_gpus: int, *, name: str | None = None) -> Cluster:
    """N GPUs of a kind's reference system (systems.yaml), e.g. ``shorthand("h100", 1024)``."""
    spec = gpu_spec(gpu)
    system = read_yaml("systems.yaml")[spec.name]
    name = name or f"{gpu}x{num_gpus}"
    domain = system["nvlink_domain"]
    per_rack = rack_share(num_gpus, domain, system["gpus_per_node"])
    if per_rack is None:
        lower = max(domain, num_gpus // domain * domain)
        raise TopologyError(
            f"{name}: {num_gpus} GPUs is not a whole number of {spec.name} NVLink domains "
            f"({domain} GPUs each)",
            f"use a multiple of {domain}, e.g. {spec.name}x{lower} or {spec.name}x{lower + domain}")
    fields = {"name": name, "gpu": spec.name, "num_gpus": num_gpus}
    if per_rack != domain:               # the racks' rail groups and pods hold the job's share of each
        fields.update(nvlink_domain=per_rack, leaf_nodes=system["leaf_nodes"] * per_rack // domain,
                      pod_size=system["pod_size"] // domain * per_rack)
    source = f"cluster {name}" if per_rack == domain else \
        f"cluster {name}: {num_gpus // per_rack} {spec.name} racks, {per_rack} of the {domain} GPUs of each"
    return from_mapping(fields, default_name=name, source=source)


def rack_share(num_gpus: int, domain: int, gpus_per_node: int) -> int | None:
    """GPUs a job of ``num_gpus`` uses per NVLink domain: the whole domain when it divides them;
    on a rack-scale domain (NVL72: 18 trays of 4) an equal share of whole trays over the fewest
    racks that hold the job (Megatron-Bridge's 256-GPU GB200 runs: 64 per rack over 4 racks) —
    the job's NVLink domain is then its share, and a rail group (a SuperPOD unit of 8 racks) and
    a pod hold that share of each of their racks; None when neither exists."""
    if num_gpus < 1:
        return None
    if num_gpus % domain == 0:
        return domain
    if domain == gpus_per_node:          # an HGX node: no partial domains
        return None
    racks = -(-num_gpus // domain)
    while racks * gpus_per_node <= num_gpus:
        share, rest = divmod(num_gpus, racks)
        if not rest and share % gpus_per_node == 0:
            return share
        racks += 1
    return None


def _load_file(path: Path) -> Cluster:
    raw = read_file(path)
    return from_mapping(raw if raw is not None else {}, default_name=path.stem, source=str(path))
