"""Start N local processes with torchrun's environment and wait for them.

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (a free local port), so a worker reads the same variables whether
``launch`` or ``torchrun`` started it.  If one process fails, the others are
terminated (only the processes started here).

``launch`` runs a command line in fresh interpreters (what ``autoplan run`` does);
``launch_function`` forks a function from a ``forkserver`` that imported the
given modules once, so N ranks do not each pay torch's import (seconds per
process on a small machine; used by the verification harness).
"""
from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

WORKER_ENV = ("RANK", "WORLD_SIZE")
STOP_S = 0.5          # how long a stopped rank may take to leave before it is killed


def in_worker() -> bool:
    """True inside a process started by ``launch`` or torchrun."""
    return all(k in os.environ for k in WORKER_ENV)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], nproc: int, *, threads: int = 1, timeout: float | None = None) -> int:
    """Run ``python ARGV`` as ``nproc`` ranks; 0, or the exit code of the first rank that failed
    (124 when ``timeout`` seconds pass).

    ``threads``: OMP/torch threads per process (1 keeps N processes from
    oversubscribing the cores).
    """
    port = free_port()
    procs: list[subprocess.Popen] = []
    for rank in range(nproc):
        env = dict(os.environ, **rank_env(rank, nproc, port, threads))
        procs.append(subprocess.Popen([sys.executable, *argv], env=env))
    return _wait(procs, lambda p: p.poll(), lambda p: p.returncode, timeout)


def allocator_env() -> dict[str, str]:
    """The CUDA caching allocator's setting for the ranks: expandable segments, as torchtitan's
    launcher sets them, unless the caller's environment chose one (``PYTORCH_CUDA_ALLOC_CONF``
    or its newer name ``PYTORCH_ALLOC_CONF``).  The default memory margin holds for FSDP plans
    under expandable segments and not under classic ones, where FSDP2's unsharded parameters
    fragment the cached segments (``costmodels.allocator``; RESULTS "Public memory rows":
    llama3-8b FSDP128 needs 9.5 GiB beyond its allocated peak under classic segments, 0.2 under
    expandable ones)."""
    if "PYTORCH_CUDA_ALLOC_CONF" in os.environ or "PYTORCH_ALLOC_CONF" in os.environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def rank_env(rank: int, nproc: int, port: int, threads: int) -> dict[str, str]:
    """torchrun's variables for one local rank, and the allocator setting (``allocator_env``)."""
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads), **allocator_env())


def launch_function(target: Callable[..., None], args: tuple, nproc: int, *, threads: int = 1,
                    preload: Iterable[str] = (), timeout: float | None = None) -> int:
    """Run ``target(*args)`` as ``nproc`` ranks forked from a forkserver that imported ``preload``.

    ``target`` must be a module-level function.  Returns like ``launch``.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(target, args, rank_env(rank, nproc, port, threads)))
             for rank in range(nproc)]
    for p in procs:
        p.start()
    return _wait(procs, lambda p: None if p.is_alive() else p.exitcode, lambda p: p.exitcode, timeout)


def _rank_main(target: Callable[..., None], args: tuple, env: dict[str, str]) -> None:
    os.environ.update(env)
    target(*args)


def _wait(procs: list, poll: Callable, code: Callable, timeout: float | None) -> int:
    """Wait for all; on the first failure (or timeout: 124) stop the rest and return its code."""
    deadline = None if timeout is None else time.monotonic() + timeout
    first_failure = 0
    try:
        done: set[int] = set()
        while len(done) < len(procs):
            for i, p in enumerate(procs):
                if i not in done and poll(p) is not None:
                    done.add(i)
                    if code(p) != 0 and not first_failure:
                        first_failure = code(p) if code(p) > 0 else 1
                        print(f"rank {i} failed first (exit code {code(p)}); the other ranks are stopped, "
                              f"so their errors may only follow from it", file=sys.stderr, flush=True)
            if first_failure:
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"no rank failed but {timeout:g} s passed; the ranks are stopped", file=sys.stderr, flush=True)
                first_failure = 124
                break
            time.sleep(0.05)
    finally:
        running = [p for p in procs if poll(p) is None]
        for p in running:            # all asked at once, then waited for: one STOP_S at most, not one per rank
            p.terminate()
        for p in running:
            _join(p)
    return first_failure


def _join(p) -> None:
    """Wait for a rank ``terminate`` asked to stop; past ``STOP_S`` kill it (Ctrl-C and SIGTERM must
    end ``autoplan run`` within 2 s: a rank blocked in a collective whose peer is gone never
    returns to Python to act on SIGTERM)."""
    if isinstance(p, subprocess.Popen):
        try:
            p.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    else:
        p.join(STOP_S)
        if p.is_alive():
            p.kill()
            p.join()
