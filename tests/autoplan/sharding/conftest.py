"""Traced blocks and sharding contexts shared by the block-ILP tests (tracing is the slow part)."""
from __future__ import annotations

import pytest

import topologies
from autoplan.frontend import trace
from costmodels import compute
from costmodels.collectives import collective_time


class FirstRanksPricer:
    """A ``sharding.Pricer`` written from the cost formulas directly: ops by the roofline of
    ``costmodels.compute``, tp collectives by ``costmodels.collectives`` on ranks 0…tp−1."""

    def __init__(self, cluster, tp: int):
        self.cluster, self.span = cluster, cluster.span(range(tp))
        self.profile = compute.load_profile(cluster.gpu.name)

    def op_seconds(self, kind, flops, nbytes, gemm):
        gpu = self.cluster.gpu
        return compute.op_time(kind, flops, nbytes, peak_flops=gpu.bf16_flops, hbm_bw=gpu.hbm_bw,
                               profile=self.profile, gemm=gemm)

    def collective_seconds(self, kind, nbytes, axis):
        assert axis == "tp", "the block ILP prices collectives on the tp axis only"
        return collective_time(kind, nbytes, self.span, self.cluster)


def context_factory(cluster_name: str):
    """A ShardingContext builder pricing ops and tp collectives on ``cluster_name``'s first tp ranks."""
    from autoplan.sharding import ShardingContext

    cluster = topologies.load(cluster_name)

    def make(tp, sp, **kw):
        return ShardingContext(tp=tp, sp=sp, pricer=FirstRanksPricer(cluster, tp), **kw)
    return make


@pytest.fixture(scope="session")
def gpt_block():
    """A GPT-3-width block (h=12288, 96 heads), flash attention, dropout."""
    return trace("gpt:layers=2,hidden=12288,heads=96,vocab=51200", seq=2048).blocks[0].graph


@pytest.fixture(scope="session")
def llama_block():
    """A Llama-3-70B-width block (GQA 64/8 heads, SwiGLU, RMSNorm, RoPE)."""
    return trace("llama:layers=2,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256", seq=4096).blocks[0].graph


@pytest.fixture(scope="session")
def gpt_eager_block():
    """Korthikanti's setting: 22B GPT block, eager attention (s×s scores), dropout."""
    return trace("gpt:layers=2,hidden=6144,heads=64,vocab=51200,attention=eager", seq=2048).blocks[0].graph


@pytest.fixture(scope="session")
def h100():
    return context_factory("h100x1024")


@pytest.fixture(scope="session")
def a100():
    return context_factory("selene")

