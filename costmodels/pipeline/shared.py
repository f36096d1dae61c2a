"""Per-shape results shared by the worker processes of one search: a directory of pickles.

A pipeline shape's pure functions — its compiled order (``events.compile_schedule``), its
steady-state period (``steady.find_period``), its live-memory walk (``live._walk``) and its
in-flight counts (``bounds.peak_activations``) — cost tens of milliseconds each, and every worker
of a search needs many of the same few dozen.  Each process keeps its own ``lru_cache`` of them;
without this each worker rebuilt the shapes a sibling had already built.

``shared(fn)`` goes under the ``lru_cache``: while ``sharing(directory)`` is open (the search
opens it before it forks its workers, which inherit it), a miss reads
``directory/<fn>-<digest of its arguments>.pkl`` where a sibling wrote it, else computes the
result and writes it (to a temporary name, then renamed: a reader sees a whole file or none).
The results are pure functions of their arguments, so which process built one changes no
number; with no directory open, ``fn`` runs as written.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager

_DIRECTORY: str | None = None


def shared(fn):
    """``fn`` (positional arguments of stable ``repr``) cached in the open sharing directory."""
    name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"

    @functools.wraps(fn)
    def wrapper(*args):
        directory = _DIRECTORY
        if directory is None:
            return fn(*args)
        path = os.path.join(directory, f"{name}-{hashlib.sha1(repr(args).encode()).hexdigest()}.pkl")
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            pass
        out = fn(*args)
        partial = f"{path}.{os.getpid()}"
        try:
            with open(partial, "wb") as f:
                pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, path)
        except OSError:          # a full or vanished directory: the result still stands
            pass
        return out
    return wrapper


@contextmanager
def sharing():
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
