"""Does a plan compute what the single-process model computes?  Losses and gradients, compared.

``verify(configs, nproc)`` runs every config in one launch of ``nproc`` processes
(one after the other, sharing the process start-up), runs each on one process too
(``train.run_reference``) and compares:

* loss: max over steps of |l − l_ref| / |l_ref| (the global loss of each step);
* gradients of the last step, before its update: the relative error of all
  gradients together, ‖g − g_ref‖ / ‖g_ref‖, and of each tensor; a tensor whose
  reference norm is below 1e-4·‖g_ref‖ is numerically zero (e.g. a key bias that
  softmax ignores) and only counts in the total;
* against a tolerance scaled to fp32 rounding over the model's depth and the
  number of ranks (``Tolerance``), stated with the result.

Runs are in eval mode (``RunConfig.dropout=False``): no dropout masks to differ.

Each rank (``_worker``, forked by ``launch_function``; or ``python -m
autoplan.apply.verify WORKDIR`` under torchrun) reads ``WORKDIR/configs.json`` and
the ranks that hold full gradients write ``WORKDIR/<config>.<rank>.pt``.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from autoplan.apply.launch import launch_function
from autoplan.apply.train import RunConfig, run_reference

SIGNIFICANT = 1e-4
FP32_EPS = 2.0 ** -23       # fp32 machine epsilon
REORDER = 32                # relative error, in ε, of one layer's reductions summed in another order


@dataclass(frozen=True)
class Tolerance:
    """How far an fp32 parallel run may be from the single-process run and still be right.

    tol = REORDER · ε · (L + 2) · √N, with ε = 2⁻²³ (fp32), L blocks (plus the embedding
    and the head: L + 2 layers that forward and backward pass through), N ranks.  A plan
    computes the same sums as one process in another order (partial sums over tp/cp/ep
    shards, micro-batch and dp averages); each layer's reordered reductions (of up to ~10³
    terms, a random walk of √10³ ≈ 32 roundings) are off by about REORDER·ε, the errors add up
    over the layers, and each rank's partial sum adds an independent rounding (√N).  A wrong
    placement or exchange is off by 10⁻³ or more, far above it.
    """

    depth: int
    ranks: int

    @property
    def value(self) -> float:
        return REORDER * FP32_EPS * (self.depth + 2) * math.sqrt(self.ranks)

    def __str__(self) -> str:
        return (f"{self.value:.2e} = {REORDER}·ε·(L+2)·√N, fp32 ε = 2^-23, L = {self.depth} blocks, "
                f"N = {self.ranks} ranks")


@dataclass(frozen=True)
class Check:
    """How far a plan's run is from the single-process run.

    ``tensor_errors``: (name, ‖g − g_ref‖ / ‖g_ref‖, counted) per gradient tensor, by name;
    a tensor is not counted when its reference norm is below SIGNIFICANT · ‖g_ref‖ (all).
    """

    config: RunConfig
    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    loss_rel: float
    grad_rel: float
    worst_tensor_rel: float
    worst_tensor: str
    tensors: int
    missing: tuple[str, ...]
    tolerance: Tolerance
    tensor_errors: tuple[tuple[str, float, bool], ...] = ()

    def ok(self, tol: float | None = None) -> bool:
        """Within ``tol`` (default: the stated tolerance) on the loss and every counted gradient."""
        tol = self.tolerance.value if tol is None else tol
        return (not self.missing and len(self.losses) == len(self.reference_losses)
                and max(self.loss_rel, self.grad_rel, self.worst_tensor_rel) <= tol)

    def summary(self) -> str:
        return (f"loss rel err {self.loss_rel:.2e}, gradient rel err {self.grad_rel:.2e} "
                f"(worst tensor {self.worst_tensor_rel:.2e} {self.worst_tensor}) over {self.tensors} "
                f"tensors" + (f"; missing {', '.join(self.missing)}" if self.missing else ""))

    def report(self) -> str:
        """One line per gradient tensor, then the loss, all gradients and the tolerance."""
        width = max((len(n) for n, _, _ in self.tensor_errors), default=0)
        lines = [f"  grad {name:<{width}}  rel err {err:.2e}" + ("" if counted else "  (numerically zero, not counted)")
                 for name, err, counted in self.tensor_errors]
        lines += [f"  grad {name:<{width}}  MISSING" for name in self.missing]
        lines.append(f"  loss (max over {len(self.losses)} steps) rel err {self.loss_rel:.2e}; all gradients "
                     f"{self.grad_rel:.2e}; worst tensor {self.worst_tensor_rel:.2e} {self.worst_tensor}")
        lines.append(f"  tolerance {self.tolerance}")
        return "\n".join(lines)


def compare(config: RunConfig, losses: list[float], grads: dict[str, torch.Tensor],
            ref_losses: list[float], ref_grads: dict[str, torch.Tensor], tolerance: Tolerance) -> Check:
    loss_rel = max((abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)), default=math.inf)
    missing = tuple(sorted(set(ref_grads) - set(grads)))
    total = math.sqrt(sum(g.double().norm().item() ** 2 for g in ref_grads.values()))
    diff = 0.0
    worst, worst_name = 0.0, ""
    errors = []
    for name, ref in sorted(ref_grads.items()):
        if name not in grads:
            continue
        d = (grads[name].double() - ref.double()).norm().item()
        diff += d * d
        norm = ref.double().norm().item()
        counted = norm >= SIGNIFICANT * total
        errors.append((name, d / norm if norm else (0.0 if d == 0 else math.inf), counted))
        if counted and d / norm > worst:
            worst, worst_name = d / norm, name
    return Check(config=config, losses=tuple(losses), reference_losses=tuple(ref_losses), loss_rel=loss_rel,
                 grad_rel=math.sqrt(diff) / total if total else math.inf, worst_tensor_rel=worst,
                 worst_tensor=worst_name, tensors=len(ref_grads) - len(missing), missing=missing,
                 tolerance=tolerance, tensor_errors=tuple(errors))


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
    """Run ``configs`` on ``nproc`` processes and on one, without dropout; compare each."""
    configs = [replace(c, dropout=False) for c in configs]
    with tempfile.TemporaryDirectory(prefix="autoplan-verify-") as tmp:
        results = run_parallel(configs, nproc, tmp, timeout)
    return [check_against_reference(cfg, losses, grads, nproc) for cfg, (losses, grads) in zip(configs, results)]


def check_against_reference(cfg: RunConfig, losses: list[float], grads: dict[str, torch.Tensor],
                            nproc: int) -> Check:
    """Run ``cfg`` on one process (fp32, CPU) and compare the parallel run's results with it."""
    ref_losses, ref_grads, depth = run_reference(replace(cfg, backend="gloo"))
    return compare(cfg, losses, grads, ref_losses, ref_grads, Tolerance(depth, nproc))


def _worker(workdir: Path) -> None:
    import torch.distributed as dist

    from autoplan.apply.train import init_distributed, leave_distributed, run_steps

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
    leave_distributed()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
