"""The search engine (see ``driver`` for the whole story).

    from autoplan.search import search, SearchOptions
    result = search(model, cluster, global_batch=1536, options=SearchOptions(top_k=5))

Modules: ``driver`` (the algorithm, serial, top-down), ``records`` (options, results),
``space`` (meshes under the hard rules of ``autoplan.rules``), ``presolve`` (the block ILPs,
before any fork), ``bounds`` (memory floor and step lower bound per mesh), ``variants`` (one
degree tuple's variants), ``stages`` (micro-batch, schedule, cuts, recompute per mesh),
``choose`` (top-K, bands over the robust ``pool``, ranked by ``robust``), ``executor`` (the tasks
here or in forked workers, with look-ahead), ``progress`` (the bar).  The search calls the cost
model (``autoplan.cost``), which calls the block ILP (``autoplan.sharding``); nothing below
imports the search.
"""
from autoplan.search.bounds import lower_bound
from autoplan.search.driver import search
from autoplan.search.records import Candidate, IlpRecord, SearchOptions, SearchResult, SearchStats
from autoplan.search.space import Constraints

__all__ = ["Candidate", "Constraints", "IlpRecord", "SearchOptions", "SearchResult", "SearchStats", "lower_bound",
           "search"]
