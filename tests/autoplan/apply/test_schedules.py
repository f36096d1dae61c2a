"""zb-h2 runs as a torch pipelining runtime schedule in the simulator's own F/B/W order."""
from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import _add_send_recv

from autoplan.apply.schedules import compute_actions, torch_orders
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from costmodels.pipeline.schedules import KIND_NAMES, build_orders

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=256"
LLAMA = "llama:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,ffn=128"
CASES = [(GPT, "pp=4,schedule=zb-h2"), (LLAMA, "pp=2,dp=2,schedule=zb-h2,zero=1")]
TORCH_KIND = {"F": "F", "B": "I", "W": "W", "BW": "B"}


@pytest.fixture(scope="module")
def checks():
    configs = [RunConfig(model=m, plan=p, steps=2, seq=16, global_batch=8, optimizer="sgd", lr=0.02)
               for m, p in CASES]
    return verify(configs, nproc=4, timeout=600)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[p for _, p in CASES])
def test_zb_h2_matches_one_process(checks, index):
    check = checks[index]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 3)])
def test_the_order_torch_runs_is_the_simulated_order(pp, m):
    """The runtime walks each rank's lowered action list in order; its compute actions are
    the simulator's ops one for one (kind, micro-batch, stage)."""
    lowered = _add_send_recv(torch_orders("zb-h2", pp, m, 1), stage_to_rank=lambda s: s, num_stages=pp)
    simulated = build_orders("zb-h2", pp, m, 1)
    for rank in range(pp):
        ran = [(a.computation_type.value, a.microbatch_index, a.stage_index) for a in compute_actions(lowered[rank])]
        want = [(TORCH_KIND[KIND_NAMES[k]], mb, s) for ((k, mb, s),) in simulated[rank]]
        assert ran == want
        assert len(lowered[rank]) > len(ran)                 # torch added the sends and receives
