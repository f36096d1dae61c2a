"""What apply refuses to run, and why."""
from __future__ import annotations

import pytest
import torch.distributed as dist
from torch import nn

from autoplan.apply import apply, check_supported
from autoplan.errors import UserError
from autoplan.plan import Plan


def test_a_sequence_context_parallelism_cannot_cut_is_named():
    with pytest.raises(UserError, match="the sequence length 6 does not divide by 4"):
        check_supported(Plan.parse("cp=2"), seq=6)
    check_supported(Plan.parse("cp=2"), seq=8)


@pytest.mark.parametrize("plan, batch, match", [
    ("pp=2,schedule=dualpipev", 2, "DualPipeV needs at least as many micro-batches as stages"),
    ("pp=4,schedule=1f1b", 2, "Schedule1F1B needs at least as many micro-batches as stages"),
    ("pp=4,schedule=zb-h1", 9, "ScheduleInterleavedZeroBubble needs the micro-batches"),
])
def test_micro_batch_counts_torch_refuses(plan, batch, match):
    with pytest.raises(UserError, match=match):
        check_supported(Plan.parse(plan), batch)
    check_supported(Plan.parse(plan), 8)


def test_supported_plans_pass():
    for plan in ("tp=2,pp=2,dp=2,zero=3", "pp=2,schedule=zbv", "pp=2,schedule=zb-h1", "pp=2,schedule=gpipe",
                 "pp=2,schedule=zb-h2", "cp=2,cp_algo=ulysses", "dp=4,ep=2", "tp=2,dp=4,ep=4,pp=2,zero=1"):
        check_supported(Plan.parse(plan))


def test_apply_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(UserError, match="initialised process group"):
        apply(nn.Linear(2, 2), Plan.parse("tp=1"), global_batch=1, seq=1)


def test_one_rank_apply_matches_the_model_and_reports_the_loss(single_rank):
    """pp = 1: micro-batches of mbs accumulate; the loss is the global-batch mean."""
    import torch

    from autoplan import zoo
    from autoplan.apply.parallel import cross_entropy
    from autoplan.zoo.spec import parse_spec

    torch.manual_seed(0)
    model = zoo.build(parse_spec("llama:layers=2,hidden=32,heads=4,vocab=64"))
    ref = zoo.build(parse_spec("llama:layers=2,hidden=32,heads=4,vocab=64"))
    ref.load_state_dict(model.state_dict())
    pm = apply(model, Plan.parse("mbs=2,recompute=full"), global_batch=4, seq=8)
    assert pm.reports_loss and pm.has_first_stage and pm.has_last_stage and pm.schedule is None
    ids = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(1))
    loss = pm.forward_backward(pm.local_batch(ids[:, :-1]), pm.local_batch(ids[:, 1:]))
    ref_loss = cross_entropy(ref(ids[:, :-1]), ids[:, 1:])
    ref_loss.backward()
    assert abs(loss - ref_loss.item()) < 1e-5
    grads = pm.full_gradients()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7)


def test_vocab_parallel_cross_entropy_equals_the_plain_loss_and_gradient(single_rank):
    """The DTensor path (shards → loss_parallel → local loss) on a one-rank tp mesh, and the
    plain path for logits that arrive whole; the 4- and 8-rank checks in test_verify run it
    split over tp = 2 and 4 against one process."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from autoplan.apply.parallel import cross_entropy, vocab_parallel_cross_entropy

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 16, generator=g)
    targets = torch.randint(0, 16, (2, 5), generator=g)
    ref_in = logits.clone().requires_grad_(True)
    ref = cross_entropy(ref_in, targets)
    ref.backward()
    for vocab in (32, 16):                       # 32: "a shard of a 32-wide vocabulary"; 16: whole
        x = logits.clone().requires_grad_(True)
        with loss_parallel():
            loss = vocab_parallel_cross_entropy(mesh, vocab)(x, targets)
            loss.backward()
        assert not isinstance(loss, DTensor) and torch.allclose(loss, ref, rtol=1e-6)
        assert torch.allclose(x.grad, ref_in.grad, rtol=1e-5, atol=1e-7)

