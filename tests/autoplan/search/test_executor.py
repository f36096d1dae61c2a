"""The search's executors (``search/executor.py``): forked workers return what running here
returns, in order; a run started ahead is kept only where it holds for the task's true item; a
search gives the same JSON on one worker as on two."""
import json
import os
import time

from autoplan.cli import main
from autoplan.search import executor
from autoplan.search.executor import ForkExecutor, Job, SerialExecutor

TINY = "llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256"


def _square(worker, x):
    return x * x, os.getpid(), worker.est


def _at(worker, item):
    value, threshold, pause = item
    time.sleep(pause)
    return value, threshold


def _holds(result, item):
    return result[1] == item[1] or item[1] == "any"


def test_forked_map_is_the_serial_map_run_in_worker_processes():
    serial = SerialExecutor("est").map(_square, range(6))
    with ForkExecutor("est", 2) as fork:
        forked = fork.map(_square, range(6))
        lone = fork.map(_square, [3])
    assert [f[0] for f in forked] == [s[0] for s in serial] == [x * x for x in range(6)]
    assert os.getpid() not in {f[1] for f in forked} and {f[2] for f in forked} == {"est"}
    assert lone == [(9, os.getpid(), "est")]                 # a lone task runs here


def test_a_run_started_ahead_is_kept_where_it_holds_else_run_again():
    asked = []

    def upcoming(done, count):
        asked.append((list(done), count))
        return [Job(2, (2, "ahead", 0.0)), Job(3, (3, "ahead", 0.0))]

    with ForkExecutor("est", 2, look_ahead=1) as fork:
        batches = fork.best_first(_at, _holds)
        first = batches.run([Job(0, (0, "t", 0.0)), Job(1, (1, "t", 0.5))], upcoming)
        second = batches.run([Job(2, (2, "true", 0.0)), Job(3, (3, "any", 0.0))], lambda done, count: [])
    assert first == [(0, "t"), (1, "t")]
    assert asked == [([(0, "t")], 2)]        # once, when the first result was in: 1 task per worker
    assert second == [(2, "true"), (3, "ahead")]       # 2 ran again at its true item; 3's run ahead held


def test_no_look_ahead_waits_for_every_batch():
    asked = []
    with ForkExecutor("est", 2, look_ahead=0) as fork:
        out = fork.best_first(_at, _holds).run([Job(0, (0, "t", 0.0)), Job(1, (1, "t", 0.3))],
                                               lambda done, count: asked.append(done) or [])
    assert out == [(0, "t"), (1, "t")] and asked == []


def test_one_worker_and_two_give_byte_identical_json(capsys, monkeypatch):
    """``--workers 1`` searches here, ``--workers 2`` in forked workers; the batches and
    thresholds do not depend on the workers (``driver.BATCH``), so neither does the JSON."""
    forks = []
    enter = ForkExecutor.__enter__

    def counted(self):
        forks.append(self.workers)
        return enter(self)
    monkeypatch.setattr(executor.ForkExecutor, "__enter__", counted)
    outs, forked = [], []
    for workers in ("1", "2"):
        forks.clear()
        assert main(["search", TINY, "--cluster", "h100x64", "--global-batch", "64", "--json",
                     "--workers", workers]) == 0
        outs.append(capsys.readouterr().out)
        forked.append(list(forks))
    assert outs[0] == outs[1] and len(json.loads(outs[0])) == 5
    assert forked[0] == [] and forked[1] and set(forked[1]) == {2}
