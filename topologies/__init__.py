"""Hardware: the GPU catalog, the cluster model (NVLink domains, rails, pods) and named clusters.

Knows no prices (those are in ``costmodels``) and imports nothing from ``autoplan`` or torch.

    >>> import topologies
    >>> c = topologies.load("h100x1024")
    >>> c.span(range(8)).level, c.span([0, 8]).level
    ('nvlink', 'rail')
"""
from topologies.cluster import LEVELS, Cluster, GroupSpan
from topologies.cluster_yaml import dump_yaml, from_mapping, to_mapping
from topologies.errors import TopologyError
from topologies.gpus import GPUSpec, gpu_names, gpu_spec
from topologies.registry import load, named_cluster_names, named_clusters, shorthand

__all__ = ["LEVELS", "Cluster", "GPUSpec", "GroupSpan", "TopologyError", "dump_yaml",
           "from_mapping", "gpu_names", "gpu_spec", "load", "named_cluster_names",
           "named_clusters", "shorthand", "to_mapping"]
