"""Does a plan compute what the single-process model computes?  Losses and gradients, compared.

``verify(configs, nproc)`` runs every config in one launch of ``nproc`` processes
(one after the other, sharing the process start-up), runs each on one process too
(``train.run_reference``) and compares:

* loss: max over steps of |l − l_ref| / |l_ref| (the global loss of each step);
* gradients of the last step, before its update: the relative error of all
  gradients together, ‖g − g_ref‖ / ‖g_ref‖, and the worst per-tensor relative
  error among tensors whose reference norm is at least 1e-4·‖g_ref‖ (smaller
  ones are numerically zero, e.g. a key bias that softmax ignores, and only count
  in the total).

Each rank (``_worker``, forked by ``launch_function``; or ``python -m
autoplan.apply.verify WORKDIR`` under torchrun) reads ``WORKDIR/configs.json`` and
the ranks that hold full gradients write ``WORKDIR/<config>.<rank>.pt``.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from autoplan.apply.launch import launch_function
from autoplan.apply.train import RunConfig, run_reference

SIGNIFICANT = 1e-4


@dataclass(frozen=True)
class Check:
    """How far a plan's run is from the single-process run."""

    config: RunConfig
    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    loss_rel: float
    grad_rel: float
    worst_tensor_rel: float
    worst_tensor: str
    tensors: int
    missing: tuple[str, ...]

    def ok(self, tol: float = 1e-5) -> bool:
        return (not self.missing and len(self.losses) == len(self.reference_losses)
                and max(self.loss_rel, self.grad_rel, self.worst_tensor_rel) <= tol)

    def summary(self) -> str:
        return (f"loss rel err {self.loss_rel:.2e}, gradient rel err {self.grad_rel:.2e} "
                f"(worst tensor {self.worst_tensor_rel:.2e} {self.worst_tensor}) over {self.tensors} "
                f"tensors" + (f"; missing {', '.join(self.missing)}" if self.missing else ""))


def compare(config: RunConfig, losses: list[float], grads: dict[str, torch.Tensor],
            ref_losses: list[float], ref_grads: dict[str, torch.Tensor]) -> Check:
    loss_rel = max((abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)), default=math.inf)
    missing = tuple(sorted(set(ref_grads) - set(grads)))
    total = math.sqrt(sum(g.double().norm().item() ** 2 for g in ref_grads.values()))
    diff = 0.0
    worst, worst_name = 0.0, ""
    for name, ref in sorted(ref_grads.items()):
        if name not in grads:
            continue
        d = (grads[name].double() - ref.double()).norm().item()
        diff += d * d
        norm = ref.double().norm().item()
        if norm >= SIGNIFICANT * total and d / norm > worst:
            worst, worst_name = d / norm, name
    return Check(config=config, losses=tuple(losses), reference_losses=tuple(ref_losses), loss_rel=loss_rel,
                 grad_rel=math.sqrt(diff) / total if total else math.inf, worst_tensor_rel=worst,
                 worst_tensor=worst_name, tensors=len(ref_grads) - len(missing), missing=missing)


def run_parallel(configs: list[RunConfig], nproc: int, workdir: str | Path,
                 timeout: float | None = None) -> list[tuple[list[float], dict[str, torch.Tensor]]]:
    """Losses and last-step gradients of each config, run on ``nproc`` processes in one launch."""
    workdir = Path(workdir)
    (workdir / "configs.json").write_text(json.dumps([c.to_dict() for c in configs], sort_keys=True))
    rc = launch_function(_worker, (workdir,), nproc, preload=("autoplan.apply.verify",), timeout=timeout)
    if rc != 0:
        raise RuntimeError(f"verification workers failed (exit {rc}); see their output above")
    out = []
    for i in range(len(configs)):
        losses: list[float] = []
        grads: dict[str, torch.Tensor] = {}
        for f in sorted(workdir.glob(f"{i}.*.pt")):
            part = torch.load(f)
            losses = part["losses"] or losses
            grads.update(part["grads"])
        out.append((losses, grads))
    return out


def verify(configs: list[RunConfig], nproc: int, timeout: float | None = None) -> list[Check]:
    """Run ``configs`` on ``nproc`` processes and on one; compare each."""
    with tempfile.TemporaryDirectory(prefix="autoplan-verify-") as tmp:
        results = run_parallel(configs, nproc, tmp, timeout)
    checks = []
    for cfg, (losses, grads) in zip(configs, results):
        ref_losses, ref_grads = run_reference(cfg)
        checks.append(compare(cfg, losses, grads, ref_losses, ref_grads))
    return checks


def _worker(workdir: Path) -> None:
    import torch.distributed as dist

    from autoplan.apply.train import init_distributed, run_steps

    configs = [RunConfig(**d) for d in json.loads((workdir / "configs.json").read_text())]
    device = init_distributed(configs[0].backend)
    for i, cfg in enumerate(configs):
        pm, losses, grads = run_steps(cfg, device, keep_last_gradients=True)
        writer = all(c == 0 for axis, c in pm.coords.items() if axis != "pp")
        if writer:
            torch.save({"losses": losses if pm.reports_loss else [],
                        "grads": {k: v.cpu() for k, v in grads.items()}},
                       workdir / f"{i}.{dist.get_rank()}.pt")
        del pm
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
