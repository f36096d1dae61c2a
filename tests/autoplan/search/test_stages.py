"""The stage search's shortcuts (the plan floor, estimate memo) and the pipeline's steady-state
extrapolation change no result: the same top-K JSON as the reference path, with fewer plans priced."""
import json
import math
from dataclasses import replace

import pytest

import topologies
from autoplan.cost import EstimateOptions, Estimator, rounded
from autoplan.cost.bounds import plan_floor
from autoplan.frontend import trace
from autoplan.search import SearchOptions, search, stages
from autoplan.search.space import enumerate_meshes
from autoplan.search.stages import recompute_floor

# long-32k: memory binds (recomputation needed on some meshes); llama7b: nothing binds,
# pipelines run up to 256 micro-batches (extrapolated steps); the floor skips plans in both
CASES = {
    "long-32k-32xh100": ("llama:layers=16,hidden=2048,heads=16,kv_heads=8,ffn=8192,vocab=32000", 32768,
                         "h100x32", 32, True),
    "llama7b-128xh100": ("llama:layers=32,hidden=4096,heads=32,kv_heads=32,ffn=11008,vocab=32000", 4096,
                         "h100x128", 256, False),
}


def _run(model, cluster, batch, *, exact=False):
    options = SearchOptions(workers=1, top_k=5, estimate=EstimateOptions(exact=exact))
    result = search(model, cluster, global_batch=batch, options=options)
    text = json.dumps([rounded(c.to_dict()) for c in result.candidates], indent=2, sort_keys=True)
    return text, result.stats.plans_priced


@pytest.mark.slow        # 15-45 s per case on 2 cores; CI runs the slow tier too
@pytest.mark.parametrize("case", sorted(CASES))
def test_shortcuts_keep_the_top_k_and_price_fewer_plans(case):
    spec, seq, cluster_name, batch, binds = CASES[case]
    model, cluster = trace(spec, seq=seq), topologies.load(cluster_name)
    new, new_priced = _run(model, cluster, batch)
    old, old_priced = _run(model, cluster, batch, exact=True)        # the reference path
    assert new == old
    assert new_priced < old_priced


def test_bounds_are_below_every_recompute_policy():
    """``plan_floor`` is below the step under every recompute policy, tells ``fits`` exactly as the
    estimate does, and is not vacuous (within 25 % of the step; 1F1B's is nearly exact below ZeRO-3)."""
    spec, seq, cluster_name, batch, _ = CASES["llama7b-128xh100"]
    model, cluster = trace(spec, seq=seq), topologies.load(cluster_name)
    est = Estimator(model, cluster)
    meshes, _ = enumerate_meshes(model.model, model.num_layers, cluster, seq=seq, global_batch=batch)
    checked = 0
    for mesh in [x for x in meshes if x.pp > 1][:6]:
        for schedule, vpp in (("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("zbv", 2), ("zb-h2", 1)):
            plan = mesh.plan(mbs=1, schedule=schedule, vpp=vpp, recompute=("none",))
            none = est.estimate(plan, batch, detail=False)
            floor_of = plan_floor(est, plan, batch)
            bound = floor_of.step_s
            assert (floor_of.fits, floor_of.memory_gib, floor_of.memory_per_stage_gib) == \
                (none.fits, none.memory_gib, none.memory_per_stage_gib)
            floor = recompute_floor(none)
            for policy in ("none", "selective", "full"):
                step = est.estimate(plan.replace(recompute=(policy,)), batch, detail=False).step_time_s
                assert bound <= step and floor <= step
            # 1F1B's floor is nearly exact, except for ZeRO-2/3's exposed FSDP traffic (not in the floor)
            tight = schedule == "1f1b" and plan.zero < 2
            assert bound >= (0.99 if tight else 0.75) * none.step_time_s, (plan, bound)
            checked += 1
    assert checked >= 30


def _dict_dp_cuts(layer_work, pre, post, rank_of_chunk, slack):
    """``balanced_cuts``'s DP written plainly (a dict of states per chunk, as it was before it
    was vectorised): the reference the numpy pass must reproduce cut for cut."""
    n, chunks = len(layer_work), len(rank_of_chunk)
    prefix = [0.0]
    for w in layer_work:
        prefix.append(prefix[-1] + w)
    even = n / chunks
    lo, hi = max(1, int(even) - slack), int(even) + 1 + slack
    states = {0: (0.0, (), (0.0,) * (max(rank_of_chunk) + 1))}
    for c in range(chunks):
        nxt = {}
        remaining, rank = chunks - c - 1, rank_of_chunk[c]
        first, last = (pre if c == 0 else 0.0), (post if c == chunks - 1 else 0.0)
        for used, (peak, cuts, loads) in states.items():
            for k in range(lo, hi + 1):
                end = used + k
                if end > n or (remaining and n - end < remaining) or (not remaining and end != n):
                    continue
                load = loads[rank] + (prefix[end] - prefix[used] + first + last)
                key = (max(peak, load), cuts + (k,))
                if end not in nxt or key < nxt[end][:2]:
                    nxt[end] = (key[0], key[1], loads[:rank] + (load,) + loads[rank + 1:])
        states = nxt
    return states[n][1] if n in states else None


def test_balanced_cuts_is_the_dict_dp():
    """Random layer works (some all equal: ties everywhere), one or several chunks per rank,
    default and tight slacks: the same cuts as the plain DP, or both find none."""
    import random
    rng = random.Random(3)
    checked = 0
    for trial in range(300):
        layers, pp = rng.randint(2, 40), rng.randint(1, 8)
        vpp = rng.choice((1, 1, 2, 3))
        if pp * vpp > layers:
            continue
        work = [1.0] * layers if trial % 3 == 0 else [rng.uniform(0.5, 1.5) for _ in range(layers)]
        pre, post = rng.uniform(0, 3), rng.uniform(0, 5)
        ranks = tuple((c % pp) if trial % 2 else min(c, 2 * pp - 1 - c) % pp for c in range(pp * vpp))
        slack = rng.choice((None, 0, 1, 2))
        want = _dict_dp_cuts(work, pre, post, ranks,
                             slack if slack is not None else 1 + math.ceil(max(pre, post) / min(work)))
        try:
            got = stages.balanced_cuts.__wrapped__(tuple(work), pre, post, ranks, slack)
        except ValueError:
            got = None
        assert got == want, (work, pre, post, ranks, slack)
        checked += got is not None
    assert checked > 150


def test_least_recompute_is_the_priced_choice():
    """``_best_recompute`` floors a policy only while some rank still needs it: on meshes where
    memory binds it picks the plan, per-stage policies and shortfall that pricing every uniform
    policy picks (``_best_recompute_priced``, the reference path)."""
    spec, seq, cluster_name, batch, _ = CASES["long-32k-32xh100"]
    model, cluster = trace(spec, seq=seq), topologies.load(cluster_name)
    est = Estimator(model, cluster)
    meshes, _ = enumerate_meshes(model.model, model.num_layers, cluster, seq=seq, global_batch=batch)
    outcomes = set()
    for mesh in [x for x in meshes if x.zero == 1 and (batch // x.dp) % 8 == 0]:
        plan = mesh.plan(mbs=8, schedule="1f1b", vpp=1, recompute=("none",))
        new, new_short, _ = stages._best_recompute(est, plan, batch)
        old, old_short, _ = stages._best_recompute_priced(est, plan, batch)
        assert (new is None) == (old is None) and new_short == pytest.approx(old_short, rel=1e-12)
        if new is not None:
            assert new[1] == old[1] and new[0] == old[0]
        outcomes.add("no fit" if new is None else "mixed" if len(set(new[1].recompute)) > 1 else new[1].recompute[0])
    assert {"no fit", "mixed", "none"} <= outcomes, outcomes      # memory binds on some stages, not on others


def test_a_stage_that_needs_part_of_ops_saving_takes_op_on_the_fewest_layers():
    """With the memory limit between a plan's need without recomputation and under ``op``, a
    search asked for ``op:N`` (``PARTIAL_OP``) returns op on the first N layers only, the least N
    that fits — faster than op on every layer (llama3-70b on h100x1024: op:51, 7.57 s against
    op's 7.85 s, the hedge issue 38's scenarios asked for); by default it returns op."""
    from autoplan.plan import RECOMPUTE, Plan
    from autoplan.search.space import PARTIAL_OP, Constraints

    model, cluster, batch = trace("llama:layers=8,hidden=1024,heads=8,kv_heads=8,ffn=4096,vocab=32000",
                                  seq=8192), topologies.load("h100x8"), 16
    plan = Plan.parse("tp=1,pp=1,dp=8,mbs=1,recompute=none,zero=3", num_gpus=8)
    bare = Estimator(model, cluster, EstimateOptions(memory_margin_gib=0.0))
    none, op = (bare.estimate(plan.replace(recompute=(rc,)), batch, detail=False) for rc in ("none", "op"))
    margin = bare.usable_bytes / 2 ** 30 - (none.memory_gib + op.memory_gib) / 2      # the limit halfway
    options = EstimateOptions(memory_margin_gib=margin)
    fixed = Constraints(tp=(1,), cp=(1,), pp=(1,), dp=(8,))

    def first(constraints):
        return search(model, cluster, global_batch=batch, options=SearchOptions(
            workers=1, estimate=options, mbs=(1,), zero=(3,), samples=0, objective="point",
            constraints=constraints)).candidates[0]
    found = first(replace(fixed, recompute=RECOMPUTE + (PARTIAL_OP,)))
    (policy,) = found.plan.recompute
    head, _, n = policy.partition(":")
    assert head == "op" and 1 <= int(n) < 8 and found.estimate.fits
    est = Estimator(model, cluster, options)
    fewer = est.estimate(found.plan.replace(recompute=(f"op:{int(n) - 1}",) if int(n) > 1 else ("none",)),
                         batch, detail=False)
    every = est.estimate(found.plan.replace(recompute=("op",)), batch, detail=False)
    assert not fewer.fits and every.fits and found.estimate.step_time_s < every.step_time_s
    assert first(fixed).plan.recompute == ("op",)                                # not asked: op
