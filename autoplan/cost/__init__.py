"""The cost model: price a Plan of a traced model on a cluster, one module per parallelism.

    from autoplan.cost import Estimator, estimate
    est = Estimator(model, cluster)           # caches block layouts across plans
    e = est.estimate(plan, global_batch=1536)

Modules: ``comms`` (memoised op, collective and simulator prices), ``tp`` (block layouts from
the ILP), ``cp``, ``ep``, ``pp``, ``dp`` (ZeRO 0–3, optimizer), ``memory``, ``parts`` (one graph
under a plan), ``report`` (primitives, breakdown, violations), ``bounds`` (what the search
prunes with), ``estimator`` (the composer) and ``types`` (the records).
"""
from autoplan.cost.estimator import Estimator, estimate
from autoplan.cost.types import Estimate, EstimateOptions, Primitive, Violation, rounded

__all__ = ["Estimate", "EstimateOptions", "Estimator", "Primitive", "Violation", "estimate", "rounded"]
