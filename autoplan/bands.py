"""Defaults of the uncertainty bands and the robust ranking, importable without the cost model
(the CLI reads them to build its arguments): the search objectives, the default objective, and
how many paired parameter samples a run draws with which seed (``cost/uncertainty.py``,
``search/robust.py``)."""
OBJECTIVES = ("point", "p50", "p90", "regret")
DEFAULT_OBJECTIVE = "regret"
DEFAULT_SAMPLES = 24
DEFAULT_SEED = 0
