"""The robust pool's bands priced in forked workers (``choose._bands``), after a mesh search in
forked workers, are the bands the sampler gives plan by plan in one process: same pool, same
steps, same ranking, same JSON."""
import json

from autoplan.cost import Estimator
from autoplan.cost.uncertainty import Sampler
from autoplan.frontend import trace
from autoplan.search import SearchOptions, choose, search
from autoplan.search.executor import ForkExecutor
from autoplan.workload import load_cluster

MODEL = "gpt:layers=4,hidden=1024,heads=16,vocab=32000"


def test_bands_in_two_workers_are_the_bands_of_one_process():
    model, cluster = trace(MODEL, seq=1024), load_cluster("h100x64")
    runs = [search(model, cluster, global_batch=64, options=SearchOptions(samples=6, workers=w)) for w in (1, 2)]
    one, two = ([json.dumps(c.to_dict(), sort_keys=True) for c in r.candidates] for r in runs)
    assert one == two and len(one) == 5
    assert [json.dumps(c.to_dict(), sort_keys=True) for c in runs[0].pool] == \
        [json.dumps(c.to_dict(), sort_keys=True) for c in runs[1].pool]
    assert any(c.plan.pp > 1 for c in runs[1].pool)          # pipeline meshes, hedged
    assert all(c.band is not None and len(set(c.band.step_s)) > 1 for c in runs[1].candidates)


def test_bands_split_samples_across_workers_and_put_them_back_in_order():
    model, cluster = trace(MODEL, seq=1024), load_cluster("h100x64")
    result = search(model, cluster, global_batch=64, options=SearchOptions(samples=5, workers=1, top_k=2))
    pool = list(result.candidates)                      # what _bands reads: .plan and .estimate
    sampler = Sampler(Estimator(model, cluster, SearchOptions().estimate, enforce_rules=True), 5, 0)
    with ForkExecutor(sampler.base, 3) as forked_executor:
        forked = choose._bands(forked_executor, sampler, pool, 64)        # shares 0,3 | 1,4 | 2
    alone = [sampler.band(r.plan, 64, r.estimate) for r in pool]
    assert forked == alone


def test_a_plans_samples_simulated_at_once_are_each_samples_own_steps(monkeypatch):
    """``Sampler.steps`` simulates a plan's pipeline on all its samples at once
    (``prices.simulate_paired``); every step is the one each sample's estimator prices alone, and
    the paired extrapolation did run (1F1B, ZB-V and interleaved, 128 micro-batches on 4 ranks)."""
    from autoplan.plan import Plan
    from costmodels.pipeline import paired

    model, cluster = trace("gpt:layers=8,hidden=1024,heads=16,vocab=32000", seq=1024), load_cluster("h100x64")
    est = Estimator(model, cluster, SearchOptions().estimate, enforce_rules=True)
    plans = [Plan.parse(f"tp=2,pp=4,dp=8,cp=1,ep=1,vpp={v},mbs=1,schedule={s},recompute=none,sp=on,zero=1,"
                        "cp_algo=ring,order=tp-cp-ep-dp-pp") for s, v in (("1f1b", 1), ("zbv", 2), ("interleaved", 2))]
    extrapolated = []
    real = paired.extrapolate_many

    def spy(*args):
        out = real(*args)
        extrapolated.extend(x is not None for x in out)
        return out
    monkeypatch.setattr(paired, "extrapolate_many", spy)
    together = Sampler(est, 6, 0).steps(plans, 1024, range(6))
    alone = [[e.step_time_s(p, 1024) for p in plans] for e in Sampler(est, 6, 0).estimators()]
    assert together == alone
    assert len(extrapolated) == 18 and all(extrapolated)
    assert len({row[0] for row in together}) == 6          # the samples do differ
