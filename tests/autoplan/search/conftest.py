"""Traced blocks and cost contexts shared by the search tests (tracing is the slow part)."""
from __future__ import annotations

import pytest

import topologies
from autoplan.frontend import trace
from costmodels import compute
from costmodels.collectives import collective_time


def context_factory(cluster_name: str):
    """A ShardingContext builder pricing ops and tp collectives on ``cluster_name``'s first tp ranks."""
    from autoplan.search.sharding import ShardingContext

    cluster = topologies.load(cluster_name)
    profile = compute.load_profile(cluster.gpu.name)

    def op_seconds(kind, flops, nbytes, gemm):
        return compute.op_time(kind, flops, nbytes, peak_flops=cluster.gpu.bf16_flops, hbm_bw=cluster.gpu.hbm_bw,
                               profile=profile, gemm=gemm)

    def make(tp, sp, **kw):
        span = cluster.span(range(tp))
        return ShardingContext(tp=tp, sp=sp, op_seconds=op_seconds,
                               tp_seconds=lambda kind, nbytes: collective_time(kind, nbytes, span, cluster), **kw)
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
