"""Traced blocks and sharding contexts shared by the block-ILP tests (tracing is the slow part)."""
from __future__ import annotations

import itertools
import random

import pytest

import topologies
from autoplan.frontend import trace
from costmodels import compute
from autoplan.sharding.ilp import IlpNode, IlpProblem, IlpTensor, evaluate
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


# --- small random ILPs and their brute-force optimum (test_ilp, test_relaxation) -------------

def _random_problem(seed: int, nodes: int = 5, strategies: int = 3, placements: int = 3,
                   memory: bool = False) -> IlpProblem:
    rng = random.Random(seed)
    ns = tuple(IlpNode(f"n{i}", tuple(rng.uniform(0, 10) for _ in range(strategies)),
                       tuple(rng.uniform(0, 5) for _ in range(strategies)) if memory else ())
               for i in range(nodes))
    tensors = []
    for i in range(1, nodes):
        producer = rng.randrange(i)
        consumers = tuple((c, tuple(rng.randrange(placements) for _ in range(strategies)), c % 2)
                          for c in sorted(rng.sample(range(i, nodes), k=min(3, nodes - i))))
        redist = tuple((a, b, g, rng.uniform(0, 8)) for a in range(placements) for b in range(placements)
                       for g in (0, 1) if a != b)
        tensors.append(IlpTensor(f"t{i}", producer, tuple(rng.randrange(placements) for _ in range(strategies)),
                                 consumers, redist))
    budget = None
    if memory:
        budget = sorted(sum(n.memory[s] for n, s in zip(ns, ch))
                        for ch in itertools.product(range(strategies), repeat=nodes))[10]
    return IlpProblem(ns, tuple(tensors), memory_budget=budget)


def _brute_force(p: IlpProblem) -> float:
    best = float("inf")
    for ch in itertools.product(*(range(len(n.cost)) for n in p.nodes)):
        if p.memory_budget is not None and sum(n.memory[s] for n, s in zip(p.nodes, ch) if n.memory) > p.memory_budget:
            continue
        best = min(best, evaluate(p, ch))
    return best


@pytest.fixture(scope="session")
def random_problem():
    """``_random_problem``: a seeded random ILP of a few nodes (optionally with a memory row)."""
    return _random_problem


@pytest.fixture(scope="session")
def brute_force():
    """``_brute_force``: the optimum over every assignment."""
    return _brute_force
