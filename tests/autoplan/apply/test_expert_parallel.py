"""Expert parallelism on gloo matches one process: the zoo MoE (capacity buffer) and plain HF
Mixtral and Qwen2-MoE (dropless routing), ep=2 and ep=4, alone and with TP, FSDP2, ZeRO-1 and PP.

One launch of 4 ranks for the 4-rank plans (ep carved out of dp: ``tp=2,dp=2,ep=2`` is 4 ranks),
one of 8 (slow).  The exchange is real: each ep rank holds only E/ep experts, so without the
dispatch the tokens routed to other ranks' experts would be lost and the loss and the gradients
would differ from one process by far more than the tolerance.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from autoplan.apply.expert_parallel import expert_count, expert_parameter_names, find_experts, model_experts
from autoplan.apply.groups import axis_groups
from autoplan.apply.outputs import training_config
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from autoplan.axes import DENSE_DP, EXPERT_DP, GROUP_AXES
from autoplan.frontend.source import load_source
from autoplan.mesh import Mesh
from autoplan.plan import Plan

MOE = "moe:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,experts=4,topk=2,moe_ffn=64,dense_layers=1"
# a shared expert and capacity 0.5: choices beyond an expert's slots are dropped, per rank as in one process
MOE_DROP = ("moe:layers=3,hidden=64,heads=4,kv_heads=2,vocab=256,experts=4,topk=2,moe_ffn=32,"
            "shared_experts=1,capacity_factor=0.5")
HF_MIXTRAL = str(Path(__file__).parent / "models" / "hf_mixtral.py")
HF_QWEN_MOE = str(Path(__file__).parent / "models" / "hf_qwen_moe.py")
# experts additionally sharded by expert over tp (each tp rank runs half of the ep rank's experts)
EXPERTS_ON_TP = {
    "attention_norm.weight": "R", "ffn_norm.weight": "R",
    "attention.q_proj.weight": "S(0)", "attention.k_proj.weight": "S(0)",
    "attention.v_proj.weight": "S(0)", "attention.o_proj.weight": "S(1)",
    "feed_forward.gate_proj.weight": "S(0)", "feed_forward.up_proj.weight": "S(0)",
    "feed_forward.down_proj.weight": "S(1)",
    "moe.router.weight": "R", "moe.routed.w_gate": "S(0)", "moe.routed.w_up": "S(0)", "moe.routed.w_down": "S(0)",
}
FOUR = [
    (MOE, "dp=4,ep=2", {}),
    (MOE, "dp=4,ep=4", {}),
    (MOE, "tp=2,dp=2,ep=2,sp=on", {}),
    (MOE, "tp=2,dp=2,ep=2,sp=off", {"placements": EXPERTS_ON_TP}),
    (MOE_DROP, "dp=4,ep=2,zero=1", {"optimizer": "adamw", "lr": 1e-3}),
    (MOE, "dp=4,ep=2,zero=3", {}),
    (MOE, "pp=2,dp=2,ep=2,schedule=zbv", {}),                  # B/W split: all-to-all backward in B
    (HF_MIXTRAL, "dp=4,ep=2", {}),
    (HF_MIXTRAL, "dp=4,ep=4", {}),
    (HF_QWEN_MOE, "dp=4,ep=2,zero=1", {}),
    (HF_MIXTRAL, "tp=2,dp=2,ep=2", {}),
]
EIGHT = [
    (MOE, "tp=2,dp=4,ep=2,zero=1", {}),
    (MOE, "tp=2,pp=2,dp=2,ep=2,zero=3,schedule=1f1b", {}),
    (MOE, "dp=8,ep=4,zero=2", {}),
    (HF_MIXTRAL, "tp=2,dp=4,ep=4", {}),
]


def _configs(cases):
    out = []
    for model, plan, options in cases:
        base = dict(model=model, plan=plan, steps=2, seq=16, global_batch=8, optimizer="sgd", lr=0.02)
        out.append(RunConfig(**{**base, **options}))
    return out


def _ids(cases):
    return [f"{Path(m).stem.split(':')[0]}-{p}" for m, p, _ in cases]


@pytest.fixture(scope="module")
def checks_4():
    return verify(_configs(FOUR), nproc=4, timeout=600)


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
@pytest.mark.parametrize("index", range(len(FOUR)), ids=_ids(FOUR))
def test_four_rank_ep_plans_match_one_process(checks_4, index):
    check = checks_4[index]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"
    assert len(check.losses) == 2 and check.tensors > 30
    expert_grads = [n for n, _, counted in check.tensor_errors if counted and ("routed" in n or "experts" in n)]
    assert len(expert_grads) >= 6                    # every layer's expert weights, gathered over ep


@pytest.mark.slow
def test_eight_rank_ep_plans_match_one_process():
    for check in verify(_configs(EIGHT), nproc=8, timeout=600):
        assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"


def test_experts_modules_are_found_by_their_parameters():
    zoo = load_source(MOE).build()
    assert find_experts(zoo, "layers") == {f"layers.{i}.moe.routed": 4 for i in (1, 2, 3)}
    assert "layers.1.moe.routed.w_down" in expert_parameter_names(zoo, "layers")
    hf = training_config(load_source(HF_MIXTRAL).build())
    assert model_experts(hf, "model.layers") == 4
    assert expert_parameter_names(hf, "model.layers") >= {"model.layers.0.mlp.experts.gate_up_proj",
                                                          "model.layers.3.mlp.experts.down_proj"}
    assert expert_count(nn.Linear(4, 4)) == 0 and expert_count(nn.Module()) == 0
    assert model_experts(load_source("llama:layers=2,hidden=32,heads=4,vocab=64").build(), "layers") == 0


@pytest.mark.parametrize("plan", ["tp=2,dp=4,ep=2", "dp=8,ep=4,cp=2", "tp=2,dp=2,ep=2,pp=2,order=tp-dp-ep-pp-cp"])
def test_axis_groups_are_the_mesh_groups(plan):
    p = Plan.parse(plan)
    for name in (DENSE_DP, EXPERT_DP, "ep", "dp"):
        assert axis_groups(p, GROUP_AXES[name]) == Mesh.of(p).groups(name)
    assert all(len(g) == 1 for g in axis_groups(p, ())) and len(axis_groups(p, ())) == p.num_gpus


def test_an_ep_rank_holds_its_share_of_the_experts():
    from autoplan.apply.expert_parallel import shard_experts
    from autoplan.zoo.moe import Experts

    experts = Experts(4, 8, 16)
    w = experts.w_up.detach().clone()
    shard_experts(experts, ep=2, ep_rank=1, group=None)
    assert experts.w_up.shape == (2, 8, 16) and torch.equal(experts.w_up, w[2:])
