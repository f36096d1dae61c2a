"""The robust pool (search/pool.py, issue 13): meshes before near-twins, every pooled plan priced as
``estimate`` prices it, and the schedule hedge — a pipeline mesh's best plan among the schedules
that do not split the backward — found, checked against every such plan, and pooled."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.errors import UserError
from autoplan.plan import RECOMPUTE
from autoplan.search import SearchOptions, search
from autoplan.search import pool as robust_pool
from autoplan.search.stages import schedule_variants
from costmodels.pipeline import SCHEDULES as SPECS

MODEL = "gpt:layers=16,hidden=6144,heads=48,vocab=32000"     # pipelines of 2-8 ranks rank in the pool
CLUSTER, SEQ, BATCH = "h100x16", 2048, 64


@pytest.fixture(scope="module")
def setup(traced):
    import topologies
    graph, cluster = traced(MODEL, seq=SEQ), topologies.load(CLUSTER)
    return graph, cluster, Estimator(graph, cluster, EstimateOptions(), enforce_rules=True)


@pytest.fixture(scope="module")
def result(setup):
    graph, cluster, _ = setup
    return search(graph, cluster, global_batch=BATCH, options=SearchOptions(workers=1))


def _mesh(plan):
    return (plan.tp, plan.cp, plan.ep, plan.pp, plan.dp)


def test_pool_takes_every_mesh_before_a_second_variant_of_any(result, setup):
    pool = result.pool
    assert len(pool) <= robust_pool.POOL_PLANS
    meshes = list(dict.fromkeys(_mesh(c.plan) for c in pool))
    first_seconds = next(i for i, c in enumerate(pool) if _mesh(c.plan) in {_mesh(d.plan) for d in pool[:i]})
    assert first_seconds == len(meshes) >= 10               # one entry per mesh first, 13 meshes here
    heads = [c.estimate.step_time_s for c in pool[:len(meshes)]]
    assert heads == sorted(heads)                            # meshes by their fastest entry
    assert heads[0] == min(c.estimate.step_time_s for c in result.candidates)
    est = setup[2]
    for c in pool:                                           # real prices, banded on every sample
        assert c.estimate.step_time_s == est.estimate(c.plan, BATCH, detail=False).step_time_s
        assert len(c.band.step_s) == SearchOptions().samples


def _unsplit_plans(est, plan):
    """Every plan of ``plan``'s mesh variant at its micro-batch size under a schedule that does not
    split the backward, with each uniform recompute policy, that fits (brute force)."""
    m = plan.microbatches(BATCH)
    schedules = tuple(s for s in SearchOptions().schedules if not SPECS[s].split_backward)
    out = []
    for schedule, vpp in schedule_variants(plan.pp, m, est.model.num_layers, schedules=schedules, max_vpp=4):
        for policy in RECOMPUTE:
            p = plan.replace(schedule=schedule, vpp=vpp, layers=(), recompute=(policy,))
            try:
                e = est.estimate(p, BATCH, detail=False)
            except UserError:
                continue
            if e.fits:
                out.append((e.step_time_s, p))
    return out


def test_hedge_is_the_fastest_unsplit_plan_and_respects_the_reach(result, setup):
    est = setup[2]
    zb = next(c for c in result.pool if SPECS[c.plan.schedule].split_backward)      # a zero-bubble mesh
    h = robust_pool.hedge(est, zb.plan, BATCH, SearchOptions(), reach=float("inf"))
    assert h is not None and not SPECS[h.plan.schedule].split_backward
    assert _mesh(h.plan) == _mesh(zb.plan) and h.plan.mbs == zb.plan.mbs
    brute = _unsplit_plans(est, zb.plan)
    assert h.estimate.step_time_s <= min(s for s, _ in brute) * (1 + 1e-12)    # no even-cut plan beats it
    assert h.estimate.step_time_s == est.estimate(h.plan, BATCH).step_time_s
    assert robust_pool.hedge(est, zb.plan, BATCH, SearchOptions(), reach=h.estimate.step_time_s * 0.999) is None
    flat = next(c for c in result.pool if c.plan.pp == 1)
    assert robust_pool.hedge(est, flat.plan, BATCH, SearchOptions(), reach=float("inf")) is None


def test_hedges_within_reach_join_the_pool(setup, monkeypatch):
    graph, cluster, est = setup
    monkeypatch.setattr(robust_pool, "HEDGE_REACH", 1.0)      # hedges up to 2x the point optimum
    wide = search(graph, cluster, global_batch=BATCH, options=SearchOptions(workers=1)).pool
    n = len(dict.fromkeys(_mesh(c.plan) for c in wide))
    heads = wide[:n]                                          # each mesh's fastest entry
    reach = min(max(c.estimate.step_time_s for c in heads), 2 * heads[0].estimate.step_time_s)
    hedged = 0
    for c in heads:
        if not SPECS[c.plan.schedule].split_backward:
            continue
        h = robust_pool.hedge(est, c.plan, BATCH, SearchOptions(), reach=float("inf"))
        if h is not None and h.estimate.step_time_s <= reach:
            assert h.plan.to_string() in {d.plan.to_string() for d in wide}, h.plan.to_string()
            hedged += 1
    assert hedged >= 1
    pooled = [c for c in wide if c.plan.pp > 1 and not SPECS[c.plan.schedule].split_backward]
    assert len(pooled) >= hedged
