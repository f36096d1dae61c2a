"""Fixtures shared by the tests of several packages: small random block ILPs and their brute-force
optimum (the ILP layer's tests, its relaxation's, and the solver-failure messages')."""
from __future__ import annotations

import itertools
import random

import pytest

from autoplan.sharding.ilp import IlpNode, IlpProblem, IlpTensor, evaluate


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
