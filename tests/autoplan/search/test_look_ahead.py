"""The search's workers start the next batch of meshes ahead (``driver._look_ahead``); the result is
the one waiting for every batch gives: the same plans, estimates and counts."""
import pytest

from autoplan.frontend import trace
from autoplan.search import SearchOptions, driver, search
from autoplan.workload import load_cluster


@pytest.fixture(scope="module")
def llama8b():
    return trace("llama3-8b", seq=8192), load_cluster("h100x64")


def _searched(model, cluster):
    r = search(model, cluster, global_batch=256, options=SearchOptions(workers=2, samples=0, objective="point"))
    s = r.stats
    return [c.to_dict() for c in r.candidates], (s.meshes_evaluated, s.plans_priced, s.pruned_bound, s.pruned_memory)


def test_looking_ahead_gives_the_search_that_waits_for_every_batch(llama8b, monkeypatch):
    started = []
    look = driver._look_ahead

    def counted(pool, tasks, i, batch, results, done, *rest):
        ahead = rest[-1]
        before = len(ahead)
        look(pool, tasks, i, batch, results, done, *rest)
        started.append(len(ahead) - before)
    monkeypatch.setattr(driver, "_look_ahead", counted)
    ahead = _searched(*llama8b)
    assert sum(started) > 0                          # batches were started ahead
    monkeypatch.setattr(driver, "SPECULATE", False)
    started.clear()
    waited = _searched(*llama8b)
    assert started == []
    assert ahead == waited
