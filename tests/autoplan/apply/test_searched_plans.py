"""Plans *produced by autoplan search* run on CPU and match one process (issue 6 acceptance).

The search runs on a small fake cluster of 2 nodes × 4 GPUs (4-GPU NVLink domains), for the
verification models at the verification sizes.  From its ranked distinct meshes we take the
best plan and the best plans that use tensor and pipeline parallelism (those torch 2.13 can run:
no cp/ep > 1, no zb-h2), and hand each to ``apply`` with the tensor-parallel layout the block
ILP chose for it (``BlockSharding.param_placements``), not a template.
"""
from __future__ import annotations

import pytest

from autoplan.apply.parallel import check_supported
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from autoplan.cost import Estimator
from autoplan.errors import UserError
from autoplan.frontend import trace
from autoplan.mesh import Mesh
from autoplan.search import SearchOptions, search
from topologies import from_mapping

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=256,dropout=0"
LLAMA = "llama:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,ffn=128"
SEQ, BATCH = 16, 8


def fake_cluster():
    return from_mapping({"gpu": "h100", "num_gpus": 8, "gpus_per_node": 4, "nvlink_domain": 4},
                        default_name="2x4-h100", source="test")


def searched(model_spec: str) -> list[tuple[str, dict]]:
    """(plan string, ILP placements of its block) for the best runnable plans: overall, with tp, with pp."""
    model = trace(model_spec, seq=SEQ)
    cluster = fake_cluster()
    result = search(model, cluster, global_batch=BATCH, options=SearchOptions(top_k=40, workers=1, objective="point"))
    est = Estimator(model, cluster)
    picks, seen = [], set()
    for want in (lambda p: True, lambda p: p.tp > 1, lambda p: p.pp > 1):
        for c in result.candidates:
            try:
                check_supported(c.plan, BATCH)
            except UserError:
                continue
            if want(c.plan) and c.plan.to_string() not in seen:
                seen.add(c.plan.to_string())
                block = model.blocks[0]
                layout = est.layouts.sharding(block.kind, block.graph, c.plan, c.plan.recompute_of_stage(0),
                                              Mesh.of(c.plan)).param_placements
                picks.append((c.plan.to_string(), layout))
                break
    return picks


@pytest.fixture(scope="module")
def runs():
    configs = [RunConfig(model=spec, plan=plan, steps=3, seq=SEQ, global_batch=BATCH, optimizer="sgd", lr=0.02,
                         placements=layout if "tp=1," not in plan else None)
               for spec in (GPT, LLAMA) for plan, layout in searched(spec)]
    return configs, verify(configs, nproc=8, timeout=600)


@pytest.mark.slow        # an 8-rank gloo run behind a shared fixture; CI runs the slow tier too
def test_searched_plans_cover_tp_and_pp(runs):
    configs, _ = runs
    plans = [c.plan for c in configs]
    assert any("tp=1," not in p for p in plans) and any(",pp=1," not in p for p in plans)
    tp_plans = [c for c in configs if c.placements]
    assert tp_plans and all(any(v != "R" for v in c.placements.values()) for c in tp_plans)


@pytest.mark.slow        # an 8-rank gloo run behind a shared fixture; CI runs the slow tier too
def test_searched_plans_match_one_process(runs):
    configs, checks = runs
    for config, check in zip(configs, checks):
        assert check.ok(), f"{config.model} {config.plan}: {check.summary()}, tolerance {check.tolerance}"
        assert len(check.losses) == 3
