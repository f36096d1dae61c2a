"""Context parallelism (ring, Ulysses, USP) on gloo matches one process, alone and with TP, PP, FSDP2.

One launch of 4 ranks for the 4-rank plans; cp=4 USP (2 × 2) with tp=2 needs 8 ranks (slow).
The exchange is real: without it each rank would attend only to its own two chunks and the
loss and gradients would differ from one process by far more than the tolerance.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from autoplan.apply.context_parallel import (
    check_model,
    chunks_of,
    local_positions,
    split_sequence,
    torch_declines,
    usp_split,
)
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from autoplan.errors import UserError

LLAMA = "llama:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,ffn=128"
GPT = "gpt:layers=4,hidden=64,heads=4,vocab=256"
HF_LLAMA = str(Path(__file__).parent / "models" / "hf_llama.py")
FOUR = [
    (LLAMA, "cp=2,cp_algo=ring"),
    (LLAMA, "cp=2,cp_algo=ulysses"),
    (LLAMA, "cp=4,cp_algo=usp"),                                  # Ulysses 2 × ring 2
    (LLAMA, "cp=2,tp=2,sp=on,cp_algo=ring"),
    (GPT, "cp=2,tp=2,sp=off,cp_algo=ulysses"),
    (LLAMA, "cp=2,pp=2,schedule=1f1b,cp_algo=ring"),
    (GPT, "cp=2,dp=2,zero=3,cp_algo=ulysses"),
    (HF_LLAMA, "cp=2,tp=2,cp_algo=ring"),
]
EIGHT = [(LLAMA, "cp=4,tp=2,cp_algo=usp"), (LLAMA, "cp=2,tp=2,pp=2,cp_algo=ulysses")]
# cp with ep (the zoo MoE drops by capacity, so each rank's queue must be the whole sequence's) and
# with the zero-bubble V schedule (B/W split: the K/V exchange's backward runs in B)
MOE = "moe:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,experts=4,topk=2,moe_ffn=64,dense_layers=1"
MOE_DROP = "moe:layers=3,hidden=64,heads=4,kv_heads=2,vocab=256,experts=4,topk=2,moe_ffn=32,capacity_factor=0.5"
HF_MIXTRAL = str(Path(__file__).parent / "models" / "hf_mixtral.py")
COMBINED = [
    (MOE, "cp=2,dp=2,ep=2,cp_algo=ring"),
    (MOE_DROP, "cp=2,dp=2,ep=2,cp_algo=ulysses"),
    (MOE_DROP, "cp=4,cp_algo=usp"),
    (HF_MIXTRAL, "cp=2,dp=2,ep=2,cp_algo=ring"),
    (LLAMA, "cp=2,pp=2,schedule=zbv,cp_algo=ring"),
    (MOE, "cp=2,pp=2,schedule=zbv,cp_algo=ulysses"),
]


def _configs(cases):
    return [RunConfig(model=m, plan=p, steps=2, seq=16, global_batch=4, optimizer="sgd", lr=0.02) for m, p in cases]


@pytest.fixture(scope="module")
def checks_4():
    return verify(_configs(FOUR), nproc=4, timeout=600)


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
@pytest.mark.parametrize("index", range(len(FOUR)), ids=[f"{Path(m).stem.split(':')[0]}-{p}" for m, p in FOUR])
def test_four_rank_cp_plans_match_one_process(checks_4, index):
    check = checks_4[index]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"
    assert len(check.losses) == 2 and check.tensors > 30


@pytest.mark.slow
def test_eight_rank_cp_plans_match_one_process():
    for check in verify(_configs(EIGHT), nproc=8, timeout=600):
        assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"


@pytest.mark.slow
def test_cp_with_ep_and_zbv_match_one_process():
    for check in verify(_configs(COMBINED), nproc=4, timeout=900):
        assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"
        assert len(check.losses) == 2 and check.tensors > 30


def test_load_balanced_chunks_and_positions():
    assert [chunks_of(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    t = torch.arange(16).unsqueeze(0)
    assert split_sequence(t, 2, 1).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert local_positions(16, 2, 0).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert [usp_split(c) for c in (2, 4, 8, 16)] == [1, 2, 2, 4]
    with pytest.raises(UserError, match="does not divide"):
        split_sequence(torch.zeros(1, 6), 2, 0)


def test_a_model_without_position_ids_is_refused():
    class Plain(nn.Module):
        def forward(self, ids):
            return ids

    with pytest.raises(UserError, match="takes no position_ids argument"):
        check_model(Plain())


@pytest.mark.parametrize("args, words", [
    (("cuda", 1, False, 8, 8, 0.0, False), ""),                              # torch's ring runs it
    (("cpu", 1, False, 8, 8, 0.0, False), "not cpu"),                        # gloo: ours
    (("cuda", 2, False, 8, 8, 0.0, False), "ring attention only"),           # ulysses / usp
    (("cuda", 1, True, 8, 8, 0.0, False), "tp-sharded DTensors"),
    (("cuda", 1, False, 8, 2, 0.0, False), "query heads (2 vs 8)"),
    (("cuda", 1, False, 8, 8, 0.0, True), "K/V heads"),
    (("cuda", 1, False, 8, 8, 0.1, False), "dropout"),
])
def test_torch_context_parallel_dispatch(args, words):
    """CUDA ring calls torch covers go to torch's context_parallel; everything else stays ours."""
    why = torch_declines(*args)
    assert (why == "") == (words == "") and words in why


def test_cpu_attention_never_takes_the_torch_path(monkeypatch):
    """With a cp mesh given, a CPU call still runs the module's own exchange (cp = 1 here: one rank)."""
    import torch.nn.functional as F

    from autoplan.apply import context_parallel as cpmod

    monkeypatch.setattr(cpmod, "torch_ring_attention", lambda *a: pytest.fail("took torch's path on CPU"))
    groups = cpmod.CPGroups(cp=1, cp_rank=0, ulysses=1, ulysses_group=None, ring=(0,), ring_index=0)
    q = torch.randn(1, 2, 4, 8)
    with cpmod.ContextParallelAttention(groups, cp_mesh=object()):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, q, q, is_causal=True), atol=1e-6)
