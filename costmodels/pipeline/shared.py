"""Per-shape results shared by the worker processes of one search: a directory of pickles.

A pipeline shape's pure functions — its compiled order (``events.compile_schedule``), its
steady-state period (``steady.find_period``), its live-memory walk (``live._walk``) and its
in-flight counts (``bounds.peak_activations``) — cost tens of milliseconds each, and every worker
of a search needs many of the same few dozen.  Each process keeps its own memo of them
(``costmodels.memo.memo(limit, shared=True)``); without this each worker rebuilt the shapes a
sibling had already built.

``read_or_build`` is what such a memo does on a miss: while ``sharing()`` is open (the search
opens it before it forks its workers, which inherit it), it reads
``directory/<name>-<digest of the arguments>.pkl`` where a sibling wrote it, else computes the
result and writes it (to a temporary name, then renamed: a reader sees a whole file or none).
A process about to compute claims the name first (``<name>.claim``, created exclusively); a
sibling that finds the claim waits for the file instead of building the same shape at the same
time, and builds it itself if the claim goes away without one (the builder failed) or after
``WAIT_S``.  Waits cannot cycle: a shared function only calls shared functions of later stages
(in-flight counts → period → compiled order), and a process waits on nothing while it holds a
claim of the last stage.  The results are pure functions of their arguments, so which process
built one changes no number; with no directory open, ``compute`` runs as written.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_DIRECTORY: str | None = None


def read_or_build(name: str, args: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    """``compute()``, the result of function ``name`` on ``args`` (positional arguments of
    stable ``repr``), read from the open sharing directory where a sibling built it."""
    directory = _DIRECTORY
    if directory is None:
        return compute()
    path = os.path.join(directory, f"{name}-{hashlib.sha1(repr(args).encode()).hexdigest()}.pkl")
    hit = _read(path)
    if hit is None and not _claim(path):
        hit = _wait(path)
    if hit is not None:
        return hit[0]
    try:
        out = compute()
        partial = f"{path}.{os.getpid()}"
        try:
            with open(partial, "wb") as f:
                pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, path)
        except OSError:          # a full or vanished directory: the result still stands
            pass
    finally:
        _release(path)
    return out


WAIT_S = 60.0           # longest wait for a sibling's claimed result before building it here
POLL_S = 0.001


def _read(path: str) -> tuple[Any] | None:
    """(the result at ``path``,) where a process wrote it, else None."""
    try:
        with open(path, "rb") as f:
            return (pickle.load(f),)
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):
        return None


def _claim(path: str) -> bool:
    """Claim the building of ``path``: True where this process is to build it (also where the
    directory cannot take the claim), False where a sibling claimed it first."""
    try:
        os.close(os.open(f"{path}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True


def _release(path: str) -> None:
    try:
        os.unlink(f"{path}.claim")
    except OSError:
        pass


def _wait(path: str) -> tuple[Any] | None:
    """The result a sibling claimed, once written; None (build it here) where its claim is gone
    without a result or ``WAIT_S`` passed, after claiming it where it is free."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        hit = _read(path)
        if hit is not None:
            return hit
        if not os.path.exists(f"{path}.claim"):
            hit = _read(path)       # written and released between the two looks
            if hit is not None or _claim(path):
                return hit
        time.sleep(POLL_S)
    return None


@contextmanager
def sharing() -> Iterator[str]:
    """Open a fresh sharing directory for this process and the ones it forks; removed on exit."""
    global _DIRECTORY
    previous = _DIRECTORY
    directory = tempfile.mkdtemp(prefix="autoplan-shapes-")
    _DIRECTORY = directory
    try:
        yield directory
    finally:
        _DIRECTORY = previous
        shutil.rmtree(directory, ignore_errors=True)
