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

from autoplan.apply.context_parallel import check_model, chunks_of, local_positions, split_sequence, usp_split
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


def _configs(cases):
    return [RunConfig(model=m, plan=p, steps=2, seq=16, global_batch=4, optimizer="sgd", lr=0.02) for m, p in cases]


@pytest.fixture(scope="module")
def checks_4():
    return verify(_configs(FOUR), nproc=4, timeout=600)


@pytest.mark.parametrize("index", range(len(FOUR)), ids=[f"{Path(m).stem.split(':')[0]}-{p}" for m, p in FOUR])
def test_four_rank_cp_plans_match_one_process(checks_4, index):
    check = checks_4[index]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"
    assert len(check.losses) == 2 and check.tensors > 30


@pytest.mark.slow
def test_eight_rank_cp_plans_match_one_process():
    for check in verify(_configs(EIGHT), nproc=8, timeout=600):
        assert check.ok(), f"{check.config.plan}: {check.summary()}, tolerance {check.tolerance}"


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
