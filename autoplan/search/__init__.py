"""The search engine (see ``driver`` for the whole story).

    from autoplan.search import search, SearchOptions
    result = search(model, cluster, global_batch=1536, options=SearchOptions(top_k=5))

Modules: ``ilp`` (the sharding ILP and its two backends), ``placements`` and ``sharding``
(one block's operator sharding on the tp axis), ``space`` (meshes under the hard rules),
``stages`` (micro-batch, schedule, cuts, recompute per mesh), ``driver`` (best-first mesh
search with bounds and worker processes).  Names are loaded lazily so that the cost model
can use ``sharding`` without importing the driver.
"""
from __future__ import annotations

_DRIVER_NAMES = ("search", "SearchOptions", "SearchResult", "SearchStats", "Candidate", "IlpRecord", "lower_bound")


def __getattr__(name: str):
    if name in _DRIVER_NAMES:
        from autoplan.search import driver
        return getattr(driver, name)
    raise AttributeError(f"module 'autoplan.search' has no attribute {name!r}")


__all__ = list(_DRIVER_NAMES)
