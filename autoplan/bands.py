"""Defaults of the uncertainty bands and the robust ranking, importable without the cost model
(the CLI reads them to build its arguments): the search objectives, the default objective, and
how many paired parameter samples a run draws with which seed (``cost/uncertainty.py``,
``search/robust.py``)."""
from typing import Literal, get_args

Objective = Literal["point", "p50", "p90", "regret"]
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
DEFAULT_OBJECTIVE: Objective = "regret"
DEFAULT_SAMPLES = 24
DEFAULT_SEED = 0
