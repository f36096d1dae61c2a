"""The degree pickers and the fit ladder every recipe shares."""
from __future__ import annotations

import pytest

from autoplan.baselines.common import MAX_VPP, divisors, ep_degree, interleaving, tp_degree
from autoplan.ir import ModelInfo
from topologies import load


def info(**kw) -> ModelInfo:
    return ModelInfo(name="m", **kw)


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


@pytest.mark.parametrize("cluster,heads,kv,cap,want", [
    ("h100x1024", 96, 96, 8, 8),          # GPT-3 on HGX
    ("h100x1024", 64, 8, 8, 8),           # Llama-3 70B: 8 KV heads
    ("h100x1024", 12, 12, 8, 4),          # 12 heads: 8 does not divide, 4 does
    ("h100x1024", 48, 8, 8, 8),           # Mixtral
    ("gb200-nvl72", 96, 96, 72, 24),      # NVL72: largest divisor of 72 and 96
    ("gb200-nvl72", 128, 8, 72, 8),       # 128 heads share only 8 with 72
    ("gb200-nvl72", 96, 96, 8, 8),        # capped at 8 (megascale, llama3)
    ("h100x1024", 40, 4, 8, 8),           # tp a multiple of the 4 KV heads
    ("h100x1024", 28, 7, 8, 1),           # 28 heads, 7 KV heads: 2 and 4 break the KV rule, 8 ∤ 28
])
def test_tp_degree(cluster, heads, kv, cap, want):
    assert tp_degree(info(heads=heads, kv_heads=kv), load(cluster), cap) == want


def test_ep_degree():
    assert ep_degree(info(experts=0), dp=64, cap=8) == 1
    assert ep_degree(info(experts=8), dp=64, cap=64) == 8           # capped by the experts
    assert ep_degree(info(experts=256), dp=128, cap=64) == 64       # DeepSeek-V3
    assert ep_degree(info(experts=256), dp=32, cap=64) == 32        # capped by dp
    assert ep_degree(info(experts=6), dp=8, cap=8) == 2             # must divide both


def test_interleaving():
    assert interleaving(96, 8, 64) == ("interleaved", 4)           # 96 = 8 stages x 4 chunks x 3 layers
    assert interleaving(96, 16, 64) == ("interleaved", 3)          # 6 layers per stage: vpp 4 does not divide
    assert interleaving(80, 4, 32) == ("interleaved", 4)
    assert interleaving(96, 8, 60) == ("1f1b", 1)                  # micro-batches not a multiple of pp
    assert interleaving(126, 16, 64) == ("1f1b", 1)                # Llama-3 405B: no even split
    assert interleaving(96, 1, 64) == ("1f1b", 1)
    assert all(v <= MAX_VPP for _, v in (interleaving(n, 2, 64) for n in range(2, 200, 2)))
