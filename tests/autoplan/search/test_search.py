"""The search against brute force, and its rules, through the public interface.

Brute force here prices every plan of the search space with the same Estimator — every mesh
(each ZeRO stage, SP, CP algorithm and axis order), micro-batch size, schedule and vpp, the
even and the balanced stage cut, and every per-stage recompute combination up to 3 stages
(beyond that the per-rank greedy is exact: a rank's memory depends only on its own policy and
the simulator's makespan is monotone in every op's duration) — and keeps the fastest that fits.
The search prunes with bounds, screens degree tuples and picks recompute
per stage greedily; it must still land within 0.5 % of that optimum.
"""
import itertools

import pytest

import topologies
from autoplan.cost import Estimator
from autoplan.errors import UserError
from autoplan.frontend import trace
from autoplan.plan import RECOMPUTE
from autoplan.search import SearchOptions, search
from autoplan.search.space import enumerate_meshes
from autoplan.search.stages import _cut_variants, schedule_variants

OPTIONS = dict(mbs=(1, 2, 4), max_vpp=3, schedules=("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv",
                                                     "dualpipev"))

CASES = {
    "gpt1.7b-64xa100": ("gpt-1.7b", 2048, "a100x64", 256),
    "llama7b-128xh100": ("llama:layers=32,hidden=4096,heads=32,kv_heads=32,ffn=11008,vocab=32000", 4096,
                         "h100x128", 256),
    "moe-64xh100": ("moe:layers=8,hidden=2048,heads=16,kv_heads=4,ffn=8192,vocab=32000,experts=8,topk=2,"
                    "moe_ffn=4096", 2048, "h100x64", 128),
    "long-32k-32xh100": ("llama:layers=16,hidden=2048,heads=16,kv_heads=8,ffn=8192,vocab=32000", 32768,
                         "h100x32", 32),
    "nvl72": ("llama:layers=8,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000", 4096, "gb200x72", 72),
}


def brute_force(model, cluster, global_batch):
    est = Estimator(model, cluster, enforce_rules=True)
    meshes, _ = enumerate_meshes(model.model, model.num_layers, cluster, seq=model.seq_len,
                                 global_batch=global_batch)
    best = None
    for mesh in meshes:
        for mbs in OPTIONS["mbs"]:
            if (global_batch // mesh.dp) % mbs:
                continue
            m = global_batch // mesh.dp // mbs
            for schedule, vpp in schedule_variants(mesh.pp, m, model.num_layers,
                                                   schedules=OPTIONS["schedules"], max_vpp=OPTIONS["max_vpp"]):
                base = mesh.plan(mbs=mbs, schedule=schedule, vpp=vpp, recompute=("none",))
                for cuts in _cut_variants(est, base):
                    combos = itertools.product(RECOMPUTE, repeat=mesh.pp) if mesh.pp <= 3 else \
                        [tuple(_greedy(est, base.replace(layers=cuts), global_batch))]
                    for rc in combos:
                        plan = base.replace(layers=cuts, recompute=rc if len(set(rc)) > 1 else rc[:1])
                        try:
                            e = est.estimate(plan, global_batch, detail=False)
                        except UserError:
                            continue
                        if e.fits and (best is None or e.step_time_s < best[0]):
                            best = (e.step_time_s, plan)
    return best


def _greedy(est, plan, global_batch):
    """Least recompute per rank whose memory fits (what each rank would pick on its own)."""
    hbm = est.cluster.gpu.hbm_bytes / 1024 ** 3
    per = {}
    for policy in RECOMPUTE:
        try:
            per[policy] = est.estimate(plan.replace(recompute=(policy,)), global_batch, detail=False)
        except UserError:
            return ["full"] * plan.pp
    return [next((p for p in RECOMPUTE if per[p].memory_per_stage_gib[r] <= hbm), "full") for r in range(plan.pp)]


@pytest.mark.slow        # 15-45 s per case on 2 cores; CI runs the slow tier too
@pytest.mark.parametrize("case", sorted(CASES))
def test_search_matches_brute_force(case):
    spec, seq, cluster_name, batch = CASES[case]
    model = trace(spec, seq=seq)
    cluster = topologies.load(cluster_name)
    result = search(model, cluster, global_batch=batch, options=SearchOptions(workers=1, objective="point", **OPTIONS))
    optimum, plan = brute_force(model, cluster, batch)
    found = result.candidates[0].estimate.step_time_s
    assert found <= optimum * 1.005, f"search {found:.6f} s ({result.candidates[0].plan}) vs brute force " \
                                     f"{optimum:.6f} s ({plan})"
    assert found >= optimum * 0.999            # the search cannot beat the space it searches
    for c in result.candidates:
        assert c.estimate.fits and not c.estimate.violations
