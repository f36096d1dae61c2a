"""Megatron-Core's engine for zero 0/1 (``autoplan/apply/distributed_optimizer.py``): bf16
weights, fp32 ``main_grad`` accumulation, fp32 masters of the rank's range, on one gloo rank."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autoplan.apply.distributed_optimizer import DistributedOptimizer, MainGrads, to_bf16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def test_gradients_accumulate_in_fp32_and_the_step_updates_the_bf16_weights(single_rank):
    model = _model()
    reference = [p.detach().clone() for p in model.parameters()]
    to_bf16(model)
    params = list(model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    grads = MainGrads(params)
    opt = DistributedOptimizer(grads, lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.0), None, (0,))
    assert [m.dtype for m in opt.masters] == [torch.float32] * len(params)      # zero=0: every parameter whole
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    probe = _model()
    to_bf16(probe)
    want = [torch.zeros_like(p, dtype=torch.float32) for p in probe.parameters()]
    for _ in range(2):                                   # two micro-batches
        model(x).float().square().mean().backward()
        assert all(p.grad is None for p in params)       # added into main_grad and freed
        for w, g in zip(want, torch.autograd.grad(probe(x).float().square().mean(), list(probe.parameters()))):
            w += g.float()                               # each bf16 gradient summed in fp32
    for p, w in zip(params, want):
        assert p.main_grad.dtype == torch.float32 and torch.equal(p.main_grad, w)
    # Megatron's masters start as fp32 copies of the bf16 weights (Float16OptimizerWithFloat16Params)
    masters = [r.to(torch.bfloat16).float().requires_grad_() for r in reference]
    ref = torch.optim.AdamW(masters, lr=0.1, weight_decay=0.0)
    for m, p in zip(masters, params):
        m.grad = p.main_grad.clone()
    ref.step()
    opt.step()
    for p, m in zip(params, masters):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))   # the fp32 master's update, in bf16
    opt.zero_grad()
    assert all(float(p.main_grad.abs().sum()) == 0.0 and p.grad is None for p in params)   # zeroed, kept


def test_a_rank_holds_masters_of_its_contiguous_range_only(single_rank):
    """Under zero=1 over d ranks this rank's masters are elements [0, ⌈N/d⌉) of the parameters
    laid end to end (a parameter may be cut), each master's gradient a view of main_grad."""
    model = _model()
    to_bf16(model)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)                   # 8·16 + 16 + 16·4 + 4 = 212
    grads = MainGrads(params)
    opt = DistributedOptimizer(grads, lambda ps: torch.optim.AdamW(ps, lr=0.1), None, (0, 5, 7))
    assert sum(m.numel() for m in opt.masters) == -(-n // 3) == 71
    assert [(x, y) for _, x, y, _ in opt.mine] == [(0, 71)]        # the first weight's first 71 elements
    assert opt.masters[0].grad.data_ptr() == params[0].main_grad.data_ptr()
    assert opt.ranges[-1] == (142, 212)


def test_a_weight_gradient_assigned_without_the_hook_is_folded(single_rank):
    model = _model()
    to_bf16(model)
    params = list(model.parameters())
    grads = MainGrads(params)
    params[0].grad = torch.ones_like(params[0])        # as torch's stage_backward_weight assigns it
    grads.fold()
    assert params[0].grad is None and float(params[0].main_grad.sum()) == pytest.approx(params[0].numel())


def test_a_split_backward_folds_each_parameter_group_as_its_weight_half_computes_it(single_rank, monkeypatch):
    """torch's split backward (``stage_backward_input`` then ``stage_backward_weight``, called by
    name from ``torch.distributed.pipelining.stage``) assigns ``.grad`` itself: without the context
    every weight's bf16 gradient is held at once after W; inside ``split_weight_gradients_folded``
    each group is folded into ``main_grad`` before the next is computed, and ``main_grad`` is
    the gradient of the full backward summed in fp32."""
    from torch.distributed.pipelining import stage as stage_module
    from torch.distributed.pipelining._backward import stage_backward_input

    from autoplan.apply.distributed_optimizer import split_weight_gradients_folded

    x = torch.randn(5, 8, dtype=torch.bfloat16)
    probe = _model()
    to_bf16(probe)
    want = [g.float() for g in torch.autograd.grad(probe(x).float().square().mean(), list(probe.parameters()))]

    def weight_half(model):
        inp = x.clone().requires_grad_()
        out = model(inp)
        seed = torch.autograd.grad(out.float().square().mean(), out, retain_graph=True)[0]
        _, groups = stage_backward_input((out,), (seed,), [inp], model.parameters())
        stage_module.stage_backward_weight(model.parameters(), groups)
        return groups

    held_at_each_group = []
    real = stage_module.stage_backward_weight

    def spy(weights, param_groups, retain_graph=False):
        weights = list(weights)
        held_at_each_group.append(sum(w.grad is not None for w in weights))
        return real(iter(weights), param_groups, retain_graph=retain_graph)

    monkeypatch.setattr(stage_module, "stage_backward_weight", spy)
    plain = _model()
    to_bf16(plain)
    MainGrads(list(plain.parameters()))
    weight_half(plain)                                        # torch alone: one call, every .grad set
    assert held_at_each_group == [0] and all(p.grad is not None for p in plain.parameters())

    held_at_each_group.clear()
    model = _model()
    to_bf16(model)
    params = list(model.parameters())
    with split_weight_gradients_folded([MainGrads(params)]):
        groups = weight_half(model)
    assert stage_module.stage_backward_weight is spy          # restored on exit
    assert len(groups) >= 2 and held_at_each_group == [0] * len(groups)   # nothing held when the next group starts
    assert all(p.grad is None for p in params)
    for p, w in zip(params, want):
        assert torch.equal(p.main_grad, w)
