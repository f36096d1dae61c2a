"""The search's progress bar: ``progress_bar(enabled, total, started)``, advanced once per mesh
task run or pruned.  It draws on stderr only (stdout stays the same bytes) and only once the
search has run a second, so a quick search prints nothing extra."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.progress import Progress as RichBar
    from rich.progress import TaskID


class Progress(Protocol):
    def advance(self, steps: int = 1) -> None: ...

    def stop(self) -> None: ...


class NoProgress:
    """No bar (``--json`` to a pipe, tests)."""

    def advance(self, steps: int = 1) -> None:
        pass

    def stop(self) -> None:
        pass


class RichProgress:
    """A progress bar on stderr that appears only once the search has run ``DELAY_S`` seconds
    since ``started`` (``time.perf_counter``; default now).  It vanishes when done."""

    DELAY_S = 1.0

    def __init__(self, total: int, started: float | None = None) -> None:
        self._total, self._done = total, 0
        self._p: RichBar | None = None
        self._task: TaskID | None = None
        self._start, self._clock = time.perf_counter() if started is None else started, time.perf_counter

    def advance(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._advance()

    def _advance(self) -> None:
        self._done += 1
        if self._p is None and self._clock() - self._start >= self.DELAY_S:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("searching meshes"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._task = self._p.add_task("", total=self._total, completed=self._done - 1)
            self._p.start()
        if self._p is not None and self._task is not None:
            self._p.advance(self._task)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()


def progress_bar(enabled: bool, total: int, started: float | None = None) -> Progress:
    """A ``RichProgress`` of ``total`` steps where ``enabled``, else ``NoProgress``."""
    return RichProgress(total, started) if enabled else NoProgress()
