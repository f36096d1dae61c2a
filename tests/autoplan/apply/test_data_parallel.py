"""ZeRO-1 parameter dealing (the collectives are covered by the multi-rank verification)."""
from __future__ import annotations

import torch
from torch import nn

from autoplan.apply.data_parallel import ZeroOneOptimizer


def test_parameters_are_dealt_greedily_by_size(single_rank):
    params = [nn.Parameter(torch.zeros(n)) for n in (100, 10, 10, 50)]
    made = []
    opt = ZeroOneOptimizer(params, lambda ps: made.append(ps) or torch.optim.SGD(ps, lr=1.0),
                           group=None, group_ranks=(0, 5, 7))
    assert opt.owner == [0, 1, 2, 1]                    # loads 100, 60, 10
    assert [p.numel() for p in made[0]] == [100]        # this rank (0) steps only its share
    for p in params:
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
