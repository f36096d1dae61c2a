"""How the search's tasks run: here, one after another (``SerialExecutor``), or in worker
processes forked from this one (``ForkExecutor``).  The executor decides how fast, never what:
the search hands both the same tasks in the same batches and gets the same results.

    with open_executor(est, workers, worth_forking=..., look_ahead=LOOK_AHEAD) as executor:
        executor.map(fn, items)                       # [fn(worker, item) for item in items]
        batches = executor.best_first(fn, holds)      # one best-first pass
        batches.run(jobs, upcoming)                   # one batch of it

A task is a module-level function ``fn(worker, item)``: ``worker`` (``Worker``) is the state it
reads in the process that runs it, the search's estimator and its band sampler.  Forked workers
inherit the estimator as it is when they fork, block ILP solutions and caches included, and
share the pipeline shapes each builds through a directory (``costmodels.pipeline.shared``) that
the executor opens before it forks and removes when it closes.

**Looking ahead.**  The search runs a pass's tasks best-first, a batch at a time, each batch at
the threshold the results before it give (the K-th best so far).  In workers, once the first
task of a batch is in while others still run, the executor starts the tasks of the next
batches (``upcoming``), ``look_ahead`` per worker, at the threshold the results so far give, so
no worker idles.  A task's result depends on its item alone, and the true threshold, once the
whole batch is in, is at most the one it ran at (the K-th best only falls): a run started ahead
is kept where ``holds(its result, the task's true item)`` (``MeshResult.same_below``), else the
task runs again.  The batches, thresholds and results are the ones waiting for every batch gives
(``look_ahead=0``).
"""
from __future__ import annotations

import multiprocessing as mp
import signal
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, Protocol, TypeVar

from autoplan.cost import Estimator
from autoplan.cost.uncertainty import Sampler
from costmodels.pipeline.shared import sharing

LOOK_AHEAD = 2        # tasks per worker started ahead (gpt-1t/h100x1024's screen, 2 workers: 2.2 s at 1, 2.1 s
                      # at 2 and 3)
DEPTH = 1             # tasks a worker holds at once: one, so that it is waiting in recv when one is sent (with two,
                      # a worker blocked sending a large result while this process blocks sending it a task deadlocks)
POLL_S = 0.002        # how long a gather waits on its first unfinished run before looking again

T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Worker:
    """The state a task reads in the process that runs it: the search's estimator, and the band
    sampler of each (sample count, seed) it was asked for, built there on first use so that its
    per-sample estimators and caches live in that process."""

    def __init__(self, est: Estimator) -> None:
        self.est = est
        self._samplers: dict[tuple[int, int], Sampler] = {}

    def sampler(self, samples: int, seed: int) -> Sampler:
        """``Sampler(est, samples, seed)``, the same object for every task of this process."""
        key = (samples, seed)
        if key not in self._samplers:
            self._samplers[key] = Sampler(self.est, samples, seed)
        return self._samplers[key]


@dataclass(frozen=True)
class Job(Generic[T]):
    """One task of a best-first pass: ``key``, its place in the pass (ascending, unique), and the
    item its function runs on."""

    key: int
    item: T


Task = Callable[[Worker, T], R]
Upcoming = Callable[[list[R], int], list[Job[T]]]   # (a batch's results in so far, n) -> the next batches' Jobs, ≥ n
Holds = Callable[[R, T], bool]              # (a result run ahead, the task's true item) -> it is that item's


class Batches(Protocol[T, R]):
    def run(self, jobs: list[Job[T]], upcoming: Upcoming[R, T]) -> list[R]:
        """The results of ``jobs``, in order."""


class Executor(Protocol):
    @property
    def workers(self) -> int:
        """Tasks run at once."""

    def map(self, fn: Task[T, R], items: Sequence[T]) -> list[R]:
        """``fn(worker, item)`` of every item, in order."""

    def best_first(self, fn: Task[T, R], holds: Holds[R, T]) -> Batches[T, R]:
        """A runner of one best-first pass of ``fn``'s batches (module docstring)."""


class _Run(Protocol[R_co]):
    """A task's run in a worker, as ``_gather`` reads it (a ``multiprocessing`` ``AsyncResult``)."""

    def ready(self) -> bool: ...

    def wait(self, timeout: float) -> None: ...

    def get(self) -> R_co: ...


class SerialExecutor:
    """Every task here, one after another: the reference, and ``--workers 1``."""

    workers = 1

    def __init__(self, est: Estimator) -> None:
        self._worker = Worker(est)

    def __enter__(self) -> SerialExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def map(self, fn: Task[T, R], items: Sequence[T]) -> list[R]:
        return [fn(self._worker, item) for item in items]

    def best_first(self, fn: Task[T, R], holds: Holds[R, T]) -> Batches[T, R]:
        return _SerialBatches(self, fn)


@dataclass(frozen=True)
class _SerialBatches(Generic[T, R]):
    executor: SerialExecutor
    fn: Task[T, R]

    def run(self, jobs: list[Job[T]], upcoming: Upcoming[R, T]) -> list[R]:
        return self.executor.map(self.fn, [job.item for job in jobs])


class ForkExecutor:
    """``workers`` processes forked on entry with ``est`` as it is then, in shape sharing; killed
    on exit, whether the search is done or an error (Ctrl-C, SIGTERM, a bug) leaves it: a
    worker's results are only read while the search runs, so none is waited for.  ``look_ahead``:
    tasks per worker started ahead (0: wait for every batch).  A lone task runs here: forking it
    out would only wait for it."""

    def __init__(self, est: Estimator, workers: int, look_ahead: int = LOOK_AHEAD) -> None:
        self.workers, self.look_ahead = workers, look_ahead
        self._here = Worker(est)
        self._stack = ExitStack()
        self._pool: _Pool | None = None

    def __enter__(self) -> ForkExecutor:
        with ExitStack() as stack:                 # a failed fork leaves nothing open
            stack.enter_context(sharing())
            self._pool = stack.enter_context(_Pool(self.workers, self._here))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def map(self, fn: Task[T, R], items: Sequence[T]) -> list[R]:
        if len(items) < 2:
            return [fn(self._here, item) for item in items]
        runs = [self.submit(fn, item) for item in items]
        return [run.get() for run in runs]

    def submit(self, fn: Task[T, R], item: T) -> _Run[R]:
        """``fn(worker, item)`` started in a worker (as soon as one is free)."""
        assert self._pool is not None, "submit outside `with`"
        return self._pool.submit(fn, item)

    def best_first(self, fn: Task[T, R], holds: Holds[R, T]) -> Batches[T, R]:
        return _AheadBatches(self, fn, holds)


class WorkerDied(RuntimeError):
    """A worker process ended without sending its task's result (killed from outside, out of memory)."""


class _Pool:
    """Worker processes forked from this one, each with a pipe of its own: one task at a time is
    sent to an idle worker, its result read back here.  No queue or lock is shared between the
    processes, so a worker killed at any moment cannot leave one held: ``multiprocessing.Pool``'s
    terminate waits on its task queue's lock, which a worker that died inside ``get`` holds, and
    its close-and-join on tasks a dead worker will never finish (issue 37: Ctrl-C hung the search).
    Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group: this process
    answers for them) and are killed on exit."""

    def __init__(self, workers: int, worker: Worker) -> None:
        self._size, self._worker = workers, worker
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._sent: list[int] = []                      # worker -> tasks sent whose result is not in
        self._queue: deque[tuple[int, Any, Any]] = deque()
        self._done: dict[int, tuple[bool, Any]] = {}
        self._next_id = 0

    def __enter__(self) -> _Pool:
        ctx = mp.get_context("fork")
        try:
            for _ in range(self._size):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(there, self._worker), daemon=True)
                proc.start()
                there.close()
                self._procs.append(proc)
                self._conns.append(here)
                self._sent.append(0)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every worker and reap it (SIGKILL: it cannot be caught, ignored or delayed)."""
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self._procs:
            proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def submit(self, fn: Task[T, R], item: T) -> _Future[R]:
        task = self._next_id
        self._next_id += 1
        self._queue.append((task, fn, item))
        self._dispatch()
        return _Future(self, task)

    def _dispatch(self) -> None:
        """Send queued tasks to the workers with the fewest in hand, up to ``DEPTH`` each."""
        while self._queue:
            i = min(range(len(self._sent)), key=self._sent.__getitem__)
            if self._sent[i] >= DEPTH:
                return
            self._conns[i].send(self._queue.popleft())
            self._sent[i] += 1

    def collect(self, timeout: float) -> None:
        """Read the results that come in within ``timeout`` seconds (0: those in now) and give
        the freed workers the next tasks."""
        busy = {self._conns[i]: i for i, n in enumerate(self._sent) if n}
        for conn in wait(list(busy), timeout):
            i = busy[conn]                          # type: ignore[index]
            try:
                task, ok, value = self._conns[i].recv()
            except (EOFError, OSError):
                self._procs[i].join(1)
                raise WorkerDied(f"search worker {self._procs[i].pid} ended without a result (exit code "
                                 f"{self._procs[i].exitcode})") from None
            self._done[task] = (ok, value)
            self._sent[i] -= 1
        self._dispatch()

    def ready(self, task: int) -> bool:
        if task not in self._done:
            self.collect(0)
        return task in self._done

    def result(self, task: int) -> Any:
        ok, value = self._done[task]
        if not ok:
            raise value
        return value


class _Future(Generic[R_co]):
    """A task's run in a ``_Pool`` worker (``_Run``); its result is kept until the run is dropped."""

    def __init__(self, pool: _Pool, task: int) -> None:
        self._pool, self._task = pool, task

    def ready(self) -> bool:
        return self._pool.ready(self._task)

    def wait(self, timeout: float) -> None:
        if not self._pool.ready(self._task):
            self._pool.collect(timeout)

    def get(self) -> R_co:
        while not self.ready():
            self._pool.collect(1.0)
        out: R_co = self._pool.result(self._task)
        return out

    def __del__(self) -> None:
        self._pool._done.pop(self._task, None)


def fork_available() -> bool:
    """Whether this platform can fork worker processes."""
    try:
        mp.get_context("fork")
    except ValueError:
        return False
    return True


def open_executor(est: Estimator, workers: int, *, worth_forking: bool,
                  look_ahead: int = LOOK_AHEAD) -> SerialExecutor | ForkExecutor:
    """A ``ForkExecutor`` of ``workers`` processes where there are several, the caller judges the
    work ``worth_forking`` and the platform forks; else a ``SerialExecutor``.  Use it with
    ``with``."""
    if workers > 1 and worth_forking and fork_available():
        return ForkExecutor(est, workers, look_ahead)
    return SerialExecutor(est)


def _serve(conn: Connection, worker: Worker) -> None:
    """A worker's loop: run each (task id, fn, item) received, send back (task id, ok, result or
    exception); leave when the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C: the parent answers, then kills this process
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)                     # the parent's watchdog pipe (autoplan.interrupts)
    except ValueError:
        pass
    while True:
        try:
            task, fn, item = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out: tuple[int, bool, Any] = (task, True, fn(worker, item))
        except Exception as e:  # noqa: BLE001 -- re-raised in the parent, as multiprocessing.Pool does
            out = (task, False, e)
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 -- a result or exception that does not pickle
            conn.send((task, False, RuntimeError(f"a search task's {'result' if out[1] else 'error'} "
                                                 f"could not be sent back: {type(e).__name__}: {e}")))


class _AheadBatches(Generic[T, R]):
    """One best-first pass in the workers, looking ahead (module docstring): ``_ahead`` holds
    the runs started ahead, by job key, until their batch comes."""

    def __init__(self, executor: ForkExecutor, fn: Task[T, R], holds: Holds[R, T]) -> None:
        self._executor, self._fn, self._holds = executor, fn, holds
        self._ahead: dict[int, _Run[R]] = {}

    def run(self, jobs: list[Job[T]], upcoming: Upcoming[R, T]) -> list[R]:
        runs: list[_Run[R]] = [self._start(job) if (hit := self._ahead.pop(job.key, None)) is None else
                               self._kept_if_holds(hit, job) for job in jobs]
        for key in [key for key in self._ahead if key < jobs[-1].key]:     # pruned at the true threshold
            del self._ahead[key]
        ahead = self._executor.look_ahead * self._executor.workers
        return _gather(runs, None if ahead == 0 else lambda done: self._start_ahead(upcoming(done, ahead)))

    def _kept_if_holds(self, hit: _Run[R], job: Job[T]) -> _Ahead[R]:
        """``hit``, ``job`` run ahead, checked against ``job``'s true item once it is in."""
        return _Ahead(hit, lambda ran: self._holds(ran, job.item), lambda: self._start(job))

    def _start(self, job: Job[T]) -> _Run[R]:
        return self._executor.submit(self._fn, job.item)

    def _start_ahead(self, jobs: list[Job[T]]) -> None:
        for job in jobs:
            if job.key not in self._ahead:
                self._ahead[job.key] = self._start(job)


def _gather(runs: list[_Run[R]], look_ahead: Callable[[list[R]], None] | None) -> list[R]:
    """The results of ``runs`` (async runs, in order); once the first is in while others still
    run, ``look_ahead(results so far)`` once (None: never)."""
    outs: list[R | None] = [None] * len(runs)
    looked = look_ahead is None or len(runs) < 2
    while True:
        for j, run in enumerate(runs):
            if outs[j] is None and run.ready():
                outs[j] = run.get()
        waiting = [j for j, o in enumerate(outs) if o is None]
        if not waiting:
            return [o for o in outs if o is not None]       # every one is in
        if not looked and look_ahead is not None and len(waiting) < len(runs):
            look_ahead([o for o in outs if o is not None])
            looked = True
        runs[waiting[0]].wait(POLL_S)


class _Ahead(Generic[R]):
    """A task's run started ahead, for ``_gather``: once it is in, kept where ``holds(its
    result)``, else replaced by ``again()``, the task run at its true item."""

    def __init__(self, run: _Run[R], holds: Callable[[R], bool], again: Callable[[], _Run[R]]) -> None:
        self._run, self._holds, self._again, self._checked = run, holds, again, False

    def _check(self) -> None:
        if not self._checked and self._run.ready():
            self._checked = True
            if not self._holds(self._run.get()):
                self._run = self._again()

    def ready(self) -> bool:
        self._check()
        return self._checked and self._run.ready()

    def wait(self, timeout: float) -> None:
        self._check()
        self._run.wait(timeout)

    def get(self) -> R:
        while not self.ready():
            self.wait(POLL_S)
        return self._run.get()
