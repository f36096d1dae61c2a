"""Zoo models run for real on small configs: correct, not just traceable."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autoplan import zoo
from autoplan.zoo.gpt import GPTConfig
from autoplan.zoo.llama import LlamaConfig
from autoplan.zoo.moe import MoE, MoEConfig

SMALL = {
    "gpt": GPTConfig(layers=2, hidden=32, heads=4, vocab=50, max_seq=16),
    "llama": LlamaConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=50),
    "moe": MoEConfig(layers=3, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=50, experts=4, topk=2,
                     moe_ffn=16, dense_layers=1, shared_experts=1),
}


@pytest.mark.parametrize("family", sorted(SMALL))
def test_forward_backward_on_cpu(family):
    torch.manual_seed(0)
    model = zoo.build(SMALL[family])
    ids = torch.randint(0, 50, (2, 12))
    logits = model(ids)
    assert logits.shape == (2, 12, 50)
    loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(SMALL))
def test_a_fresh_model_starts_at_ln_vocab(family):
    """GPT-2 initialisation (std 0.02, residual projections / √(2L)): logits ≈ 0, loss ≈ ln V."""
    torch.manual_seed(0)
    model = zoo.build(SMALL[family]).eval()
    ids, targets = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    assert abs(loss.item() - math.log(50)) < 0.05, loss.item()


def test_gpt_eager_attention_equals_sdpa():
    torch.manual_seed(0)
    cfg = GPTConfig(layers=2, hidden=32, heads=4, vocab=50, max_seq=16, dropout=0.0)
    flash = zoo.build(cfg).eval()
    eager = zoo.build(GPTConfig(**{**cfg.__dict__, "attention": "eager"})).eval()
    eager.load_state_dict(flash.state_dict())
    ids = torch.randint(0, 50, (2, 10))
    torch.testing.assert_close(eager(ids), flash(ids), rtol=1e-4, atol=1e-5)


def test_gpt_is_causal_and_tied():
    torch.manual_seed(0)
    model = zoo.build(GPTConfig(layers=2, hidden=32, heads=4, vocab=50, max_seq=16, dropout=0.0)).eval()
    ids = torch.randint(0, 50, (1, 10))
    changed = ids.clone()
    changed[0, 7] = (ids[0, 7] + 1) % 50
    torch.testing.assert_close(model(ids)[:, :7], model(changed)[:, :7])
    assert model.lm_head is None      # head uses wte.weight


def _reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token-by-token top-k mixture (no capacity limit)."""
    flat = x.reshape(-1, x.shape[-1])
    logits = moe.router(flat)
    top, ids = logits.topk(moe.topk, dim=-1)
    gates = torch.softmax(top, dim=-1)
    w = moe.routed
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(moe.topk):
            e = ids[t, j]
            h = F.silu(flat[t] @ w.w_gate[e]) * (flat[t] @ w.w_up[e])
            out[t] += gates[t, j] * (h @ w.w_down[e])
    if moe.shared is not None:
        out = out + moe.shared(flat)
    return out.view_as(x)


def test_moe_dispatch_matches_reference_when_nothing_is_dropped():
    torch.manual_seed(0)
    cfg = MoEConfig(layers=1, hidden=16, heads=2, vocab=10, experts=4, topk=2, moe_ffn=8,
                    shared_experts=1, capacity_factor=4.0)   # capacity = all tokens: no drops
    moe = MoE(cfg)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(moe(x), _reference_moe(moe, x), rtol=1e-5, atol=1e-5)


def test_moe_capacity_drops_overflow():
    torch.manual_seed(0)
    cfg = MoEConfig(layers=1, hidden=8, heads=2, vocab=10, experts=2, topk=1, moe_ffn=4)
    moe = MoE(cfg)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0       # every token prefers expert 0 (for positive inputs)
    x = torch.rand(1, 6, 8) + 0.1
    assert moe.capacity(6) == 3          # ceil(6 tokens * top-1 / 2 experts)
    y = moe(x)
    # tokens 0..2 fit in expert 0, tokens 3..5 overflow and contribute nothing
    assert torch.count_nonzero(y[0, 3:]) == 0
    assert torch.count_nonzero(y[0, :3]) > 0


def test_dense_then_moe_layers():
    model = zoo.build(SMALL["moe"])
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Block", "MoEBlock", "MoEBlock"]


def test_gpt_position_ids_of_one_row_take_the_default_positions_layout():
    """Context parallelism passes each rank's positions as [1, s]: the position table's output
    is then [s, h] as with the default positions (one layout for apply's tp/sp plan of it), and
    the logits are those of the same positions given per row."""
    torch.manual_seed(0)
    model = zoo.build(SMALL["gpt"]).eval()         # no dropout: two forwards comparable
    ids = torch.randint(0, 50, (2, 8))
    pos = torch.arange(4, 12)[None]
    seen = []
    handle = model.wpe.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    one_row = model(ids, position_ids=pos)
    handle.remove()
    assert seen == [torch.Size([8, 32])]
    torch.testing.assert_close(one_row, model(ids, position_ids=pos.expand(2, 8)))
