"""A few training steps of a zoo model under a plan (``autoplan run``), and the same on one process.

Data are synthetic and learnable: a fixed random permutation π of the vocabulary
(seeded by ``seed``) defines the language; every sequence starts at a random token
t₀ and continues t_{i+1} = π(t_i).  The same global batch is used at every step, so
the printed loss shows optimisation progress without batch-to-batch noise.  Every
rank draws the same global batch and keeps its dp share.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from autoplan.apply.layout import find_blocks
from autoplan.apply.outputs import logits_of, training_config
from autoplan.apply.parallel import ParallelModel, apply, cross_entropy, make_optimizer
from autoplan.errors import UserError
from autoplan.plan import Plan

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class RunConfig:
    """One training run: model, plan and step parameters (all ranks get the same)."""

    model: str                        # zoo name, family spec or model.py path
    plan: str                         # plan string
    steps: int = 5
    seq: int = 64
    global_batch: int = 8             # sequences per step
    lr: float = 1e-3
    optimizer: str = "adamw"          # sgd | adamw
    dtype: str = "fp32"               # fp32 | bf16
    backend: str = "gloo"             # gloo | nccl
    seed: int = 0
    placements: dict[str, str] | None = field(default=None)   # tp placement per block parameter
    dropout: bool = True              # False: the model runs in eval mode (what a check compares)
    misplace: str | None = None       # test only: this parameter's tp shards are swapped between ranks

    def to_dict(self) -> dict:
        return asdict(self)


def build_model(cfg: RunConfig) -> nn.Module:
    """The model with seeded weights (identical on every rank), in ``cfg.dtype``; in eval mode
    (dropout off) unless ``cfg.dropout``."""
    from autoplan.frontend.source import load_source

    torch.manual_seed(cfg.seed)
    model = training_config(load_source(cfg.model, cfg.seq).build())
    model.train(cfg.dropout)
    return model.to(DTYPES[cfg.dtype])


def vocab_of(model: nn.Module) -> int:
    """Rows of the first nn.Embedding (the token embedding), or ``config.vocab``."""
    vocab = getattr(getattr(model, "config", None), "vocab", 0)
    if vocab:
        return vocab
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return m.num_embeddings
    raise UserError(f"cannot tell the vocabulary size of {type(model).__name__}",
                    "autoplan run needs a token model with an nn.Embedding")


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, targets), each [batch, seq] (see the module docstring)."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    start = torch.randint(vocab, (batch,), generator=torch.Generator().manual_seed(seed + 1))
    tokens = [start]
    for _ in range(seq):
        tokens.append(perm[tokens[-1]])
    ids = torch.stack(tokens, dim=1)
    return ids[:, :-1], ids[:, 1:]


def init_distributed(backend: str) -> torch.device:
    """Join the process group from torchrun's environment; the device of this rank."""
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return device


def leave_distributed() -> None:
    """Leave the process group together: a rank that exits while a peer still reads from its
    gloo connections fails that peer with "Connection closed by peer" (pytorch/pytorch#75512)."""
    dist.barrier()
    dist.destroy_process_group()


def cuda_devices() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_worker(cfg: RunConfig, report) -> None:
    """One rank of ``autoplan run``: join the process group, train, leave."""
    device = init_distributed(cfg.backend)
    run_steps(cfg, device, report=report)
    leave_distributed()


def run_steps(cfg: RunConfig, device: torch.device, *, report=None,
              keep_last_gradients: bool = False) -> tuple[ParallelModel, list[float], dict[str, torch.Tensor]]:
    """Build, shard and train ``cfg.steps`` steps on this rank.

    ``report(step, loss)`` is called on the reporting rank after each step.
    Returns the parallel model, the global loss per step (on last-stage ranks,
    else empty) and, with ``keep_last_gradients``, the full gradients of the last
    step before its update (a collective: every rank must ask).
    """
    plan = Plan.parse(cfg.plan, num_gpus=dist.get_world_size())
    model = build_model(cfg).to(device)
    vocab = vocab_of(model)
    pm = apply(model, plan, global_batch=cfg.global_batch, seq=cfg.seq, placements=cfg.placements)
    del model
    if cfg.misplace is not None:
        misplace_shards(pm, cfg.misplace)
    opt = pm.optimizer(cfg.optimizer, cfg.lr)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    ids, targets = (t.to(device) for t in synthetic_batch(cfg.global_batch, cfg.seq, vocab, cfg.seed))
    for step in range(cfg.steps):
        loss = pm.forward_backward(pm.local_batch(ids), pm.local_batch(targets))
        if pm.has_last_stage:
            losses.append(pm.global_loss(loss))  # type: ignore[arg-type]  # a last stage reads its loss
            if report is not None and pm.reports_loss:
                report(step + 1, losses[-1])
        if keep_last_gradients and step == cfg.steps - 1:
            grads = pm.full_gradients()
        opt.step()
        opt.zero_grad()
    return pm, losses, grads


def misplace_shards(pm: ParallelModel, name: str) -> None:
    """Give parameter ``name`` the tp shard of the next tp rank (rank c holds shard c+1 mod tp):
    what a placement applied in the wrong rank order computes.  A fault for testing the check;
    ranks whose stages do not hold ``name`` do nothing."""
    from torch.distributed.tensor import DTensor, Shard

    for fqn, p in pm.named_parameters():
        if fqn != name:
            continue
        shard = isinstance(p, DTensor) and [q for q in p.placements if isinstance(q, Shard)]
        if not shard:
            raise UserError(f"parameter {name} is not sharded over tp", "name a parameter with an S(d) placement")
        # ignore[attr-defined]: ``shard`` is truthy only for a DTensor parameter
        tp, c = p.device_mesh.size(), p.device_mesh.get_local_rank()  # type: ignore[attr-defined]
        other = p.full_tensor().chunk(tp, shard[0].dim)[(c + 1) % tp]  # type: ignore[attr-defined]
        with torch.no_grad():
            p.to_local().copy_(other)  # type: ignore[attr-defined]


def run_reference(cfg: RunConfig) -> tuple[list[float], dict[str, torch.Tensor], int]:
    """The same run on one process: losses per step, the last step's gradients and the
    model's depth (blocks).

    Micro-batches of ``mbs`` sequences, as in the plan (capacity-based MoE routing
    depends on the tokens per forward), losses averaged over the global batch.
    """
    plan = Plan.parse(cfg.plan)
    model = build_model(cfg)
    vocab = vocab_of(model)
    opt = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    n = cfg.global_batch // plan.mbs
    losses, grads = [], {}
    ids, targets = synthetic_batch(cfg.global_batch, cfg.seq, vocab, cfg.seed)
    for step in range(cfg.steps):
        total = 0.0
        for mb_ids, mb_targets in zip(ids.chunk(n), targets.chunk(n)):
            loss = cross_entropy(logits_of(model(mb_ids)), mb_targets)
            (loss / n).backward()
            total += loss.item()
        losses.append(total / n)
        if step == cfg.steps - 1:
            grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    return losses, grads, len(find_blocks(model)[1])
