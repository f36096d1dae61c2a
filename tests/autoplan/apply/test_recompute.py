"""Recomputation wraps block forwards in place and changes no number."""
from __future__ import annotations

import pytest
import torch

from autoplan import zoo
from autoplan.apply.recompute import recompute_blocks
from autoplan.zoo.spec import parse_spec

LLAMA = "llama:layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,ffn=64"


def _grads(mode):
    torch.manual_seed(0)
    model = zoo.build(parse_spec(LLAMA))
    recompute_blocks(list(model.layers), mode)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model(ids).square().mean().backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_gives_the_same_gradients_under_the_same_names(mode):
    ref, got = _grads("none"), _grads(mode)
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-6, atol=1e-8)


def test_full_recompute_keeps_only_block_inputs():
    torch.manual_seed(0)
    block = zoo.build(parse_spec(LLAMA)).layers[0]
    x = torch.randn(2, 8, 32, requires_grad=True)
    cos, sin = torch.ones(8, 8), torch.zeros(8, 8)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        block(x, cos, sin)
    plain = len(saved)
    recompute_blocks([block], "full")
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        block(x, cos, sin)
    assert len(saved) < plain
