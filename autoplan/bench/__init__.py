"""Matched-scale benchmark: autoplan's plan vs hand-written 4D recipes vs a Megatron grid.

    autoplan bench [--suite default|quick] [--out DIR] [--force] [--cases NAME,...]
    python experiments/bench.py            # the same, writing experiments/bench and RESULTS.md

For each case (``suite``: model, cluster, sequence length, global batch) the harness prices,
with one cost model (``autoplan.cost.Estimator``):

* the best plan of ``autoplan.search`` (``case``),
* every hand-written recipe of ``autoplan.baselines`` that applies (``case``),
* the best plan of a brute-force grid over the Megatron-expressible space (``grid``),

and records step time, tokens/s, MFU, memory, fit and the NVLink rule for each, the
auto/hand throughput ratios and the search time.  ``runner`` caches finished cases and
writes results.json, results.csv, the Markdown tables (``report``) and the plots (``plots``).

The harness lives in the package so that ``autoplan bench`` works from any checkout or
install; ``experiments/bench.py`` is a thin script over the same command.
"""
from autoplan.bench.case import CONTENDERS, run_case
from autoplan.bench.grid import search_grid
from autoplan.bench.runner import run_suite
from autoplan.bench.suite import SUITES, Case, select

__all__ = ["CONTENDERS", "Case", "SUITES", "run_case", "run_suite", "search_grid", "select"]
