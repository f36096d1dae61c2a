"""Shared fixtures: the CLI runner, an isolated trace cache, and traces/estimators built once per session."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m autoplan ARGS`` as a user would; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "autoplan", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


_WARM = r"""
import importlib, json, os, sys
# the libraries every CLI run would import again (about 3-5 s of each); autoplan is not among them
for name in ("torch", "torch._dynamo", "torch.fx", "torch.distributed", "torch._subclasses.fake_tensor",
             "numpy", "sympy", "yaml", "networkx", "rich.console", "ortools.sat.python.cp_model", "pandas"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    print(json.dumps({"pid": pid}), flush=True)
    print(json.dumps({"status": os.waitpid(pid, 0)[1]}), flush=True)
else:
    sys.exit(0)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                        (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
    os.dup2(os.open(path, flags), fd)
sys.stdin = open(0, closefd=False)
sys.argv = ["autoplan", *request["args"]]
import runpy
runpy.run_module("autoplan", run_name="__main__", alter_sys=True)
"""


class WarmCli:
    """``python -m autoplan ARGS`` in a process forked from one that has imported torch and the
    other libraries and nothing of autoplan: a fresh interpreter state for autoplan (its modules, caches and environment
    variables are read anew), the exit code, stdout and stderr a user sees, without paying the
    torch import for every run.  Forked children share one hash seed, so a test that compares
    two runs' bytes runs the second with ``fresh=True`` (a new interpreter)."""

    def __init__(self, tmp: str):
        self._tmp, self._proc = tmp, None

    def _server(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", _WARM], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, cwd=REPO)
            self._pending = b""
        return self._proc

    def _reply(self, timeout: float | None = None) -> dict | None:
        """The server's next JSON line, or None when none comes within ``timeout`` seconds."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the warm CLI server died")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def __call__(self, *args: str, timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess:
        if fresh or not hasattr(os, "fork"):
            return run_cli(*args, timeout=timeout)
        argv = [sys.executable, "-m", "autoplan", *args]
        out, err = os.path.join(self._tmp, "stdout"), os.path.join(self._tmp, "stderr")
        for path in (out, err):
            open(path, "w").close()
        server = self._server()
        server.stdin.write(json.dumps({"args": list(args), "cwd": REPO, "env": dict(os.environ),
                                       "stdout": out, "stderr": err}) + "\n")
        server.stdin.flush()
        pid = self._reply()["pid"]
        done = self._reply(timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self._reply()
            raise subprocess.TimeoutExpired(argv, timeout)
        code = os.waitstatus_to_exitcode(done["status"])
        with open(out) as o, open(err) as e:
            return subprocess.CompletedProcess(argv, code, o.read(), e.read())

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


@pytest.fixture(scope="session")
def cli(tmp_path_factory):
    """The CLI runner (``WarmCli``)."""
    runner = WarmCli(str(tmp_path_factory.mktemp("cli")))
    yield runner
    runner.close()


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
