"""Run a Plan on a real model with torch.distributed (DTensor TP/SP, FSDP2, pipelining).

    from autoplan.apply import apply, device_mesh
    pm = apply(model, plan, global_batch=8, seq=128)      # on every rank
    loss = pm.forward_backward(pm.local_batch(ids), pm.local_batch(targets))

Modules, one parallelism each: ``layout`` (what the model looks like),
``tensor_parallel``, ``pipeline``, ``data_parallel``, ``recompute``; ``parallel``
composes them; ``train`` and ``launch`` run ``autoplan run``; ``verify`` checks a
plan against the single-process model.
"""
from autoplan.apply.device_mesh import device_mesh
from autoplan.apply.parallel import ParallelModel, apply, check_supported, cross_entropy

__all__ = ["ParallelModel", "apply", "check_supported", "cross_entropy", "device_mesh"]
