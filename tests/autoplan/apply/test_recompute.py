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


@pytest.mark.parametrize("mode", ["full", "selective", "op", "full:1", "op:1"])
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


def test_op_keeps_every_other_matmul_and_full_n_only_the_first_n_blocks():
    """Under ``op`` a block's backward recomputes its even-numbered matmuls: 7 matmuls in a Llama
    block (q, k, v, o, w1, w3, w2) run 7 + 3 times per step; ``full:1`` wraps the first block only."""
    torch.manual_seed(0)
    model = zoo.build(parse_spec(LLAMA))
    recompute_blocks(list(model.layers), "op")
    calls = []

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func == torch.ops.aten.mm.default:
                calls.append(func)
            return func(*args, **(kwargs or {}))

    block = model.layers[0]
    x = torch.randn(2, 8, 32, requires_grad=True)
    cos, sin = torch.ones(8, 8), torch.zeros(8, 8)
    with Count():
        out = block(x, cos, sin)
        forward = len(calls)
        out.sum().backward()
    assert forward == 7
    # backward: 2 gradient matmuls per forward matmul (input and weight) + the 3 recomputed ones
    assert len(calls) - forward == 2 * 7 + 3
    fresh = zoo.build(parse_spec(LLAMA))
    plain = [b.forward for b in fresh.layers]
    recompute_blocks(list(fresh.layers), "full:1")
    assert fresh.layers[0].forward != plain[0] and fresh.layers[1].forward == plain[1]
    partial = zoo.build(parse_spec(LLAMA))
    plain = [b.forward for b in partial.layers]
    recompute_blocks(list(partial.layers), "op:1")          # op on the first block, as under op
    assert partial.layers[1].forward == plain[1] and partial.layers[0].forward.args[1] == "op"
