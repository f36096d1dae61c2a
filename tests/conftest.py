"""Shared fixtures: the CLI runner, an isolated trace cache, and traces/estimators built once per session."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m autoplan ARGS`` as a user would; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "autoplan", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture(scope="session", autouse=True)
def isolated_trace_cache(tmp_path_factory):
    """Keep test traces out of ~/.cache: one cache for the session (subprocesses inherit it)."""
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


@pytest.fixture(scope="session")
def setup():
    """``setup(model, cluster, seq=2048)`` → (BlockGraph, Cluster, Estimator), built once per session."""
    from autoplan.workload import Workload

    memo = {}

    def get(model: str, cluster: str, seq: int = 2048):
        key = (model, cluster, seq)
        if key not in memo:
            w = Workload.load(model, cluster, seq=seq, global_batch=1)
            memo[key] = (w.model, w.cluster, w.estimator())
        return memo[key]
    return get
