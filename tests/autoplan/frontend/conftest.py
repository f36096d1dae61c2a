"""Frontend test fixtures: an isolated trace cache, and traces shared by the whole session."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_trace_cache(tmp_path_factory):
    """Keep test traces out of ~/.cache (subprocesses inherit the variable)."""
    old = os.environ.get("AUTOPLAN_CACHE_DIR")
    os.environ["AUTOPLAN_CACHE_DIR"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield
    if old is None:
        os.environ.pop("AUTOPLAN_CACHE_DIR", None)
    else:
        os.environ["AUTOPLAN_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def traced():
    """``traced(model, **kw)``: a BlockGraph, traced once per session per argument set."""
    from autoplan.frontend import trace

    memo = {}

    def get(model: str, **kw):
        key = (model, tuple(sorted(kw.items())))
        if key not in memo:
            memo[key] = trace(model, **kw)
        return memo[key]
    return get
