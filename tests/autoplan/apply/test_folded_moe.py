"""MoE parallel folding (``etp``) run on gloo: the experts on the expert layout (Megatron-Core's
expert RankGenerator: etp, ep, edp), the attention on tp·cp·dp, matching one process.

``tp=2,dp=2,ep=4,etp=1`` has no ``ep | dp`` (4 ∤ 2): EP is drawn from the tp·dp ranks of the stage,
so each rank holds one of the 4 experts whole and the ep group holds attention tp peers.  Without
the expert layout's groups (the ep group, the edp reduction over it and the tp-duplicated senders
it divides out) the loss or the expert gradients would differ from one process by far more than
the tolerance.
"""
from __future__ import annotations

import pytest

from autoplan.apply.groups import axis_groups
from autoplan.apply.memcheck import unsupported
from autoplan.apply.parallel import check_supported
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from autoplan.axes import EXPERT_DP, GROUP_AXES
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import Plan

MOE = "moe:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,experts=4,topk=2,moe_ffn=64,dense_layers=1"
FOLDED = [
    ("tp=2,dp=2,ep=4,etp=1", {}),                                 # edp = 1, ep spans tp and dp
    ("tp=2,dp=2,ep=2,etp=1,sp=on", {}),                            # edp = 2: expert grads averaged over it
    ("tp=2,dp=2,ep=2,etp=2", {}),                                  # etp = tp: experts split over tp too
    ("tp=2,dp=2,ep=4,etp=1,zero=3", {}),                           # FSDP2: experts over edp
    ("tp=2,dp=2,ep=2,etp=1,zero=1", {"optimizer": "adamw", "lr": 1e-3}),
]


def _configs():
    base = dict(model=MOE, steps=2, seq=16, global_batch=8, optimizer="sgd", lr=0.02)
    return [RunConfig(**{**base, "plan": plan, **options}) for plan, options in FOLDED]


@pytest.fixture(scope="module")
def checks():
    return verify(_configs(), nproc=4, timeout=600)


@pytest.mark.slow        # a 4-rank launch (about a minute on 2 cores)
@pytest.mark.parametrize("index", range(len(FOLDED)), ids=[p for p, _ in FOLDED])
def test_folded_plans_match_one_process(checks, index):
    check = checks[index]
    assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"
    assert len(check.losses) == 2 and check.tensors > 30
    expert_grads = [n for n, _, counted in check.tensor_errors if counted and "routed" in n]
    assert len(expert_grads) == 9                    # 3 MoE layers × 3 expert weights, gathered over ep


def test_expert_groups_come_from_the_expert_layout():
    """tp=2,dp=2,ep=2,etp=1: Megatron-Core's expert generator puts etp (1) innermost, then ep, then
    edp, so ep groups are rank pairs {0,1},{2,3} (the attention tp pairs) and edp pairs {0,2},{1,3};
    etp=2 moves ep out to stride 2."""
    p = Plan.parse("tp=2,dp=2,ep=2,etp=1")
    assert axis_groups(p, ("ep",), expert=True) == [(0, 1), (2, 3)]
    assert axis_groups(p, GROUP_AXES[EXPERT_DP], expert=True) == [(0, 2), (1, 3)]
    assert axis_groups(p, ("tp",)) == [(0, 1), (2, 3)] and axis_groups(p, ("dp",)) == [(0, 2), (1, 3)]
    q = Plan.parse("tp=2,dp=2,ep=2,etp=2")
    assert axis_groups(q, ("ep",), expert=True) == [(0, 2), (1, 3)] == Mesh.of(q).groups("ep")
    assert axis_groups(q, ("tp",), expert=True) == axis_groups(q, ("tp",)) == [(0, 1), (2, 3)]


@pytest.mark.parametrize("plan", ["tp=4,dp=2,ep=4,etp=2", "tp=2,dp=4,ep=2,etp=2,order=dp-tp-cp-ep-pp"])
def test_unbuilt_folding_is_refused(plan):
    with pytest.raises(UserError) as e:
        check_supported(Plan.parse(plan))
    assert "etp=1 or etp=tp" in e.value.fix
    assert "etp=1 or etp=tp" in unsupported(Plan.parse(plan), MOE)          # memcheck says why it does not measure


def test_built_folding_is_accepted():
    for plan in ("tp=2,dp=2,ep=4,etp=1", "tp=2,dp=2,ep=2,etp=2", "tp=2,dp=4,ep=4,etp=1,zero=3"):
        check_supported(Plan.parse(plan))
        assert unsupported(Plan.parse(plan), MOE) is None
    with pytest.raises(UserError) as e:           # FSDP would average expert gradients over edp=4 > cp·dp=2
        check_supported(Plan.parse("tp=4,dp=2,ep=2,etp=1,zero=3"))
    assert "etp·ep ≥ tp" in e.value.fix
