"""The search's workers start the next batches of meshes ahead (``executor``'s look-ahead); the
result is the one waiting for every batch gives (``look_ahead=0``): the same plans, estimates and
counts."""
import pytest

from autoplan.frontend import trace
from autoplan.search import SearchOptions, executor, search
from autoplan.workload import load_cluster


@pytest.fixture(scope="module")
def llama8b():
    return trace("llama3-8b", seq=8192), load_cluster("h100x64")


def _searched(model, cluster, look_ahead):
    r = search(model, cluster, global_batch=256, options=SearchOptions(workers=2, samples=0, objective="point"),
               look_ahead=look_ahead)
    s = r.stats
    return [c.to_dict() for c in r.candidates], (s.meshes_evaluated, s.plans_priced, s.pruned_bound, s.pruned_memory)


def test_looking_ahead_gives_the_search_that_waits_for_every_batch(llama8b, monkeypatch):
    started = []
    start_ahead = executor._AheadBatches._start_ahead

    def counted(self, jobs):
        before = len(self._ahead)
        start_ahead(self, jobs)
        started.append(len(self._ahead) - before)
    monkeypatch.setattr(executor._AheadBatches, "_start_ahead", counted)
    ahead = _searched(*llama8b, look_ahead=2)
    assert sum(started) > 0                          # batches were started ahead
    started.clear()
    waited = _searched(*llama8b, look_ahead=0)
    assert started == []
    assert ahead == waited


def test_a_result_is_the_same_at_every_threshold_above_its_searched_bound(llama8b):
    """``MeshResult.same_below``, which keeps a run started ahead at a higher threshold: the
    mesh's stage search at any threshold above the largest bound it searched returns the same
    result; at that bound it searches less (the certificate is tight, not vacuous)."""
    from autoplan.cost import Estimator
    from autoplan.search.space import enumerate_meshes
    from autoplan.search.stages import best_plan

    model, cluster = llama8b
    est = Estimator(model, cluster, enforce_rules=True)
    meshes, _ = enumerate_meshes(model.model, model.num_layers, cluster, seq=model.sample_positions,
                                 global_batch=256)
    kw = dict(mbs_choices=(1, 2, 4, 8), schedules=("1f1b", "interleaved", "zbv"), max_vpp=2)
    tight = 0
    for mesh in [m for m in meshes if m.pp > 1 and m.zero == 1][:8]:
        free = best_plan(est, mesh, 256, **kw)
        assert free.searched_bound > float("-inf")
        for above in (free.searched_bound * (1 + 1e-12), free.searched_bound * 1.5):
            assert free.same_below(above)
            assert best_plan(est, mesh, 256, threshold=above, **kw) == free
        assert not free.same_below(free.searched_bound)
        capped = best_plan(est, mesh, 256, threshold=free.searched_bound, **kw)
        assert capped.searched_bound < free.searched_bound
        tight += capped != free
    assert tight > 0
