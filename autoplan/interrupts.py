"""Ctrl-C and SIGTERM at any moment: one line, exit 130 / 143 within 2 s, no process and no
partial file left (issue 37).

``install()`` (the CLI calls it before any heavy import) makes SIGINT raise ``KeyboardInterrupt``
and SIGTERM raise ``Terminated`` in the main thread, so that ``finally`` blocks and ``with``
exits run: the search's workers are killed (``search.executor``), ``autoplan run``'s ranks
stopped (``apply.launch``), a temporary output file removed (``atomic``).  A second signal
while the first unwinds is ignored, so it cannot cut that clean-up short.

A signal that arrives inside an import is not raised there (a library's import-time code may
print it and go on): the watchdog ends the process at once.  A Python signal handler runs only
when the main thread runs Python: inside a long C call (a
solver, a torch kernel) or code that swallows the exception it would wait.  So ``install`` also
starts a watchdog thread woken by the signal itself (``signal.set_wakeup_fd``): ``GRACE_S``
after a SIGINT or SIGTERM that the process has not yet ended on, it kills every descendant
process, removes the temporary files ``atomic`` registered, says the one line if nobody has, and
ends the process with the signal's exit code.

Processes forked from this one (the search's workers) inherit the handler: there it ends the
process quietly, the parent reports.  ``quiet=True`` (a rank ``autoplan run`` started, whose
parent reports): no line at all.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from autoplan.errors import EXIT_INTERRUPTED, note_sigint, track_sigint

EXIT_TERMINATED = 143      # SIGTERM (128 + 15), as a shell reports it
GRACE_S = 1.5              # how long unwinding may take before the watchdog ends the process
MESSAGES: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, as KeyboardInterrupt: an
    ``except Exception`` does not swallow it)."""


_state: dict = {"pid": -1, "signal": 0, "said": False, "quiet": False, "deferred": False}
_lock = threading.Lock()
_temporary: set[str] = set()


def exit_code(signum: int) -> int:
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED


def install(*, quiet: bool = False) -> bool:
    """Own SIGINT and SIGTERM in this process (module docstring); False where it cannot (not the
    main thread: tests calling ``main`` from a thread)."""
    try:
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
    except ValueError:
        return False
    _state.update(pid=os.getpid(), signal=0, said=False, quiet=quiet, deferred=False)
    track_sigint()
    _start_watchdog()
    return True


def received() -> int:
    """The signal this process is ending on (0: none)."""
    return _state["signal"] if _state["pid"] == os.getpid() else 0


def say_once(signum: int) -> None:
    """The one line for ``signum`` on stderr, unless it was said (or the process is quiet)."""
    with _lock:
        if _state["said"] or _state["quiet"]:
            return
        _state["said"] = True
    try:
        print(MESSAGES.get(signum, "interrupted"), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def register_temporary(path: str) -> None:
    """A file to remove if the watchdog has to end the process (``atomic``'s temporary file)."""
    _temporary.add(path)


def release_temporary(path: str | None) -> None:
    if path is not None:
        _temporary.discard(path)


def _on_signal(signum: int, frame: object) -> None:
    if os.getpid() != _state["pid"]:
        os._exit(exit_code(signum))        # a forked child before it set its own handling: quietly
    if _state["signal"]:
        return                             # already unwinding on the first one
    _state["signal"] = signum
    if signum == signal.SIGINT:
        note_sigint()
    if _importing(frame):
        _state["deferred"] = True          # the watchdog ends the process now (below)
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _importing(frame: Any) -> bool:
    """Whether ``frame`` runs inside an import.  An exception raised there can land in a library's
    import-time fallbacks or in C++ that imports Python (protobuf under OR-tools printed its
    traceback and went on): there the watchdog ends the process instead, at once."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _start_watchdog() -> None:
    """Point the signal wakeup fd at the watchdog's pipe (the thread and pipe: once per process)."""
    if _state.get("watchdog_pid") != os.getpid():
        r, w = os.pipe()
        os.set_blocking(w, False)
        _state.update(watchdog_pid=os.getpid(), wakeup=w)
        threading.Thread(target=_watch, args=(r,), name="autoplan-signal-watchdog", daemon=True).start()
    signal.set_wakeup_fd(_state["wakeup"], warn_on_full_buffer=False)


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        signums = [b for b in data if b in (signal.SIGINT, signal.SIGTERM)]   # SIGALRM: the trace's time limit
        if signums:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and not _state.get("deferred"):
                time.sleep(0.02)
            _end_now(_state["signal"] or signums[0])


def _end_now(signum: int) -> None:
    """The process did not end within the grace time: end it here."""
    for path in list(_temporary):
        try:
            os.unlink(path)
        except OSError:
            pass
    say_once(signum)
    exit_now(exit_code(signum))


def exit_now(code: int) -> None:
    """End the process with ``code`` now: flush what it wrote, kill what it started, and skip the
    interpreter's teardown (with torch imported, 1–3 s on 2 cores: longer than an interrupted
    command may take to end).  For a process that is ending on a signal, its clean-up done."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    kill_descendants()
    os._exit(code)


def descendants(pid: int | None = None) -> list[int]:
    """The processes below ``pid`` (default: this one), children first; [] where ``/proc`` is missing."""
    root = os.getpid() if pid is None else pid
    parent_of: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            parent_of[int(name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
    out, frontier = [], [root]
    while frontier:
        below = [p for p, pp in parent_of.items() if pp in frontier]
        out += below
        frontier = below
    return out


def kill_descendants() -> None:
    """SIGKILL every process below this one, and reap this one's children."""
    for pid in descendants():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
