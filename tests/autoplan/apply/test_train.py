"""Synthetic data and the single-process reference run."""
from __future__ import annotations

import math

import torch

from autoplan.apply.train import RunConfig, run_reference, synthetic_batch


def test_synthetic_batch_is_a_seeded_permutation_walk():
    ids, targets = synthetic_batch(4, 16, 50, seed=3)
    again, _ = synthetic_batch(4, 16, 50, seed=3)
    assert ids.shape == targets.shape == (4, 16) and torch.equal(ids, again)
    assert torch.equal(ids[:, 1:], targets[:, :-1])
    successor = {}
    for a, b in zip(ids.flatten().tolist(), targets.flatten().tolist()):
        assert successor.setdefault(a, b) == b                 # each token has one successor
    assert not torch.equal(ids, synthetic_batch(4, 16, 50, seed=4)[0])


def test_reference_run_learns():
    losses, grads, depth = run_reference(RunConfig(model="llama:layers=2,hidden=32,heads=4,vocab=64", plan="tp=1",
                                            steps=4, seq=16, global_batch=4, lr=3e-3))
    assert all(a > b for a, b in zip(losses, losses[1:])) and depth == 2
    assert abs(losses[0] - math.log(64)) < 0.1              # a fresh model knows nothing: ≈ ln(vocab)
    assert "output.weight" in grads and grads["output.weight"].shape == (64, 32)
