"""The cost model: price a Plan of a traced model on a cluster, one module per parallelism.

    from autoplan.cost import Estimator, estimate
    est = Estimator(model, cluster)           # caches block layouts across plans
    e = est.estimate(plan, global_batch=1536)

Modules: ``prices`` (memoised op, collective and simulator prices), ``context`` (``PlanContext``:
what every pricer reads besides its graph), ``tp`` (block layouts from the ILP), ``cp``, ``ep``,
``pp``, ``dp`` (ZeRO 0–3, optimizer), ``memory``, ``parts`` (one graph under a plan), ``report``
(primitives, breakdown, violations), ``bounds`` (what the search prunes with), ``memo`` (what an
Estimator remembers, and the typed keys), ``estimator`` (the composer) and ``types`` (the records).

**Twin paths.**  Where a quantity has a fast path beside its reference, both are kept only
because the fast one pays (measured on GPT-3 175B at h100x1024: ``step_time_s`` 155 µs against
``estimate(detail=False)`` 307 µs per plan; ``plan_memory`` 54 µs against the estimate's 134 µs
of rank memories after its simulation), each is equal to the bit, and a test says so.
``EstimateOptions.exact`` (``--exact``) runs the reference paths of the search and the
simulator.

Each row: fast path, reference, and below it the test (under ``tests/``) that they agree.

``Estimator.step_time_s``                        ``estimate(...).step_time_s``
  ↳ autoplan/cost/test_estimator.py::test_step_only_pricing_equals_the_estimates_step_to_the_bit_on_every_sample
``bounds.plan_memory`` (numpy, no simulation)    ``Estimator.rank_memories``
  ↳ autoplan/cost/test_bounds.py::test_plan_memory_is_the_estimates_to_the_bit
``simulate_many`` (``paired``: samples at once)  ``simulate`` per sample
  ↳ costmodels/test_paired.py::test_simulate_many_is_simulate_per_sample
``prices.simulate_paired`` (a band's samples)    each sample's ``step_time_s``
  ↳ autoplan/search/test_parallel_bands.py::test_a_plans_samples_simulated_at_once_are_each_samples_own_steps
``steady.extrapolate`` (period matrix)           ``simulate(..., exact=True)``
  ↳ costmodels/test_pipeline.py::test_extrapolated_step_equals_full_simulation
``steady._run_periods`` (periods one by one)     ``simulate(..., exact=True)``
  ↳ costmodels/test_pipeline.py::test_periods_run_one_by_one_give_the_full_simulation_to_the_bit
level-wise and batched period matrices           the one-at-a-time forms
  ↳ costmodels/test_steady_exact.py::test_fast_paths_are_the_one_at_a_time_forms_bit_for_bit
``live.peak_live`` (array walk), ``peak_bytes``  the ``live._events`` walk
  ↳ costmodels/test_live.py::test_peak_live_is_the_walk_bit_for_bit
``pipeline.bounds.peak_activations``             the simulated peak
  ↳ costmodels/test_pipeline_bounds.py::test_peak_without_simulation_equals_the_simulated_peak
a sample's layouts (``reprice`` templates)       pricing under its parameters
  ↳ autoplan/search/test_bands.py::test_each_sample_is_the_point_estimate_under_that_samples_parameters
``solve.layout_prices`` shared by policies       ``price_assignment`` per policy
  ↳ autoplan/sharding/test_model_reuse.py::test_prices_of_one_policy_price_every_policy
an ILP skeleton shared by one structure          the whole-text model
  ↳ autoplan/sharding/test_model_reuse.py::test_a_reused_skeleton_is_the_fresh_model_proto_for_proto
``relaxation.solve_relaxation`` (certified LP)   CP-SAT
  ↳ autoplan/sharding/test_relaxation.py::test_traced_blocks_relax_to_the_cpsat_optimum
``prepare`` shared where dims divide alike       preparing afresh
  ↳ autoplan/sharding/test_solve_memo.py::test_prepare_memo_is_the_fresh_preparation_in_every_context
``stages._best_recompute`` (memory only)         ``_best_recompute_priced``
  ↳ autoplan/search/test_stages.py::test_least_recompute_is_the_priced_choice
the stage search's floor and estimate memo       ``EstimateOptions(exact=True)``
  ↳ autoplan/search/test_stages.py::test_shortcuts_keep_the_top_k_and_price_fewer_plans
every memo (``costmodels.memo``)                 recomputing each hit (``audit()``)
  ↳ autoplan/cost/test_memo_keys.py
"""
from autoplan.cost.estimator import Estimator, estimate
from autoplan.cost.types import Estimate, EstimateOptions, Primitive, Violation, rounded

__all__ = ["Estimate", "EstimateOptions", "Estimator", "Primitive", "Violation", "estimate", "rounded"]
