"""Fixtures for the explain tests: a trace cache kept out of ~/.cache, one Estimator per setup."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_trace_cache(tmp_path_factory):
    """One trace cache under the session's temp dir (the baselines tests share it; subprocesses
    inherit the variable)."""
    path = tmp_path_factory.getbasetemp() / "autoplan-trace-cache"
    path.mkdir(exist_ok=True)
    old = os.environ.get("AUTOPLAN_CACHE_DIR")
    os.environ["AUTOPLAN_CACHE_DIR"] = str(path)
    yield
    if old is None:
        os.environ.pop("AUTOPLAN_CACHE_DIR", None)
    else:
        os.environ["AUTOPLAN_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def setup():
    """``setup(model, cluster, seq=2048)`` → (BlockGraph, Cluster, Estimator), built once per session."""
    from autoplan.commands.baseline import prepare

    memo = {}

    def get(model: str, cluster: str, seq: int = 2048):
        key = (model, cluster, seq)
        if key not in memo:
            memo[key] = prepare(model, cluster, seq, 1)
        return memo[key]
    return get
