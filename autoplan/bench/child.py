"""Run the search in a child process with a wall-clock limit.

    search_with_limit(model, cluster, global_batch=..., options=..., limit_s=900) -> SearchResult

The child is forked (it shares the traced model without copying), makes itself the leader
of a new process group, runs ``autoplan.search.search`` (whose worker pool forks inside
that group) and sends the result back through a pipe.  Past ``limit_s`` the parent kills
that one process group — the child and its workers, nothing else — and raises
``SearchTimeout``.  A search that raises is re-raised in the parent: ``UserError`` as
itself, anything else as ``SearchFailed`` naming the original exception and where it was
raised.  Killing a process is the only safe way to stop a search from outside: an
exception injected by a signal could land inside an import or a pool's bookkeeping and
leave the harness process broken for the next case.

Where ``fork`` is unavailable the search runs in this process, without a limit.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback

from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from autoplan.search import SearchOptions, SearchResult, search
from topologies.cluster import Cluster


class SearchTimeout(Exception):
    """The search ran past the case's time limit."""


class SearchFailed(Exception):
    """The search raised something other than a UserError (a bug to report)."""


def search_with_limit(model: BlockGraph, cluster: Cluster, *, global_batch: int, options: SearchOptions,
                      limit_s: float) -> SearchResult:
    try:
        ctx = mp.get_context("fork")
    except ValueError:
        return search(model, cluster, global_batch=global_batch, options=options)
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(sender, model, cluster, global_batch, options), daemon=False)
    child.start()
    sender.close()
    try:
        os.setpgid(child.pid, child.pid)  # type: ignore[arg-type]  # started: a pid; also here, so that a kill never races the child's own call
    except OSError:
        pass
    try:
        ready = receiver.poll(limit_s if limit_s and limit_s > 0 else None)
        outcome = receiver.recv() if ready else None
    except EOFError:          # the child died without answering (killed, out of memory)
        child.join(5)
        outcome = ("failed", f"the search process died without a result (exit code {child.exitcode})")
    finally:
        if child.is_alive():
            _kill_group(child.pid)  # type: ignore[arg-type]  # started: a pid
        child.join()
        receiver.close()
    if outcome is None:
        raise SearchTimeout(f"search ran past the {limit_s:g} s limit")
    kind, *payload = outcome
    if kind == "ok":
        return payload[0]
    if kind == "user":
        raise UserError(*payload)
    raise SearchFailed(payload[0])


def _child(sender, model, cluster, global_batch, options) -> None:
    os.setpgid(0, 0)            # a group of its own: the parent can stop it and its workers at once
    try:
        outcome: tuple[object, ...] = ("ok", search(model, cluster, global_batch=global_batch, options=options))
    except UserError as e:
        outcome = ("user", e.problem, e.fix)
    except BaseException as e:  # noqa: BLE001 — reported to the parent, which logs it
        frames = traceback.extract_tb(e.__traceback__)
        at = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
        outcome = ("failed", f"{type(e).__name__}: {e}{at}")
    sender.send(outcome)
    sender.close()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group the child ``pid`` leads (the child and its search workers)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
