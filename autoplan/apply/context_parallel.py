"""Context parallelism: the sequence split over the cp axis, attention exchanged (ring, Ulysses, USP).

Load-balanced causal chunking (as the cost model prices it): the sequence of S tokens is
cut into 2·cp chunks of S/(2cp) and cp rank i holds chunks i and 2cp−1−i, so every rank
has the same share of the causal attention work.  Everything but attention is per token,
so each rank runs the model's own forward on its S/cp tokens (``split_sequence``) with
their true positions passed as ``position_ids`` (``local_positions``).  Attention is
swapped inside that forward (``ContextParallelAttention``, a ``TorchFunctionMode`` catching
``F.scaled_dot_product_attention``, causal and without a mask):

* **ring**: K/V blocks travel round the cp ranks by P2P send/recv (cp−1 steps); each step
  computes the attention of the local queries on the block it holds (skipping blocks wholly
  in the future of every query), and the partial results are merged with their
  log-sum-exps: o = Σ_j exp(lse_j − lse)·o_j, lse = log Σ_j exp(lse_j).  Backward passes the
  K/V gradients back round the ring (the adjoint of each send).
* **ulysses**: an ``all_to_all`` re-shards q, k, v from sequence to heads (each rank then
  holds all S tokens of heads/cp heads), attention runs on the whole sequence, and a second
  ``all_to_all`` re-shards the output back; the backward of an all_to_all is the reverse one.
* **usp**: Ulysses inside groups of u consecutive cp ranks, ring across the cp/u groups.

The exchanges work on local tensors (a tp-sharded DTensor is unwrapped and rewrapped with
its placements), so cp composes with tp (heads), FSDP2 and pipeline stages; gradients of
the replicated parameters are averaged over cp like over dp.  Runs on gloo (CPU) and NCCL.
On CUDA, a call torch's own ``context_parallel`` covers (ring, no tp, no GQA, no dropout:
``torch_declines``) runs there instead, with the same chunking.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from autoplan.errors import UserError

MASKED = -1e30          # finite "minus infinity": a row with no visible key merges with weight 0, no NaN


def chunks_of(rank: int, cp: int) -> tuple[int, int]:
    """The two sequence chunks (of 2·cp) cp rank ``rank`` holds: i and 2cp−1−i."""
    return rank, 2 * cp - 1 - rank


def split_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's tokens of ``t`` (its two chunks along ``dim``, concatenated)."""
    if t.shape[dim] % (2 * cp):
        raise UserError(f"context parallelism cp={cp} cuts the sequence into 2·cp = {2 * cp} chunks; "
                        f"the sequence length {t.shape[dim]} does not divide", f"use a multiple of {2 * cp}")
    parts = t.chunk(2 * cp, dim)
    return torch.cat([parts[c] for c in chunks_of(rank, cp)], dim)


def chunk_positions(chunks: tuple[int, ...], length: int, device) -> torch.Tensor:
    """Token positions of a list of chunks of ``length`` tokens each."""
    return torch.cat([torch.arange(c * length, (c + 1) * length, device=device) for c in chunks])


def local_positions(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Positions [1, seq/cp] of this cp rank's tokens in the whole sequence of ``seq``."""
    return chunk_positions(chunks_of(rank, cp), seq // (2 * cp), device).unsqueeze(0)


def usp_split(cp: int) -> int:
    """Ulysses degree u of USP: the largest divisor of cp with u² ≤ cp (cp = 4 → 2 × 2, 8 → 2 × 4).
    The cost model picks u from the NVLink domain instead; a plan's ``ulysses=`` fixes it for both."""
    return max(u for u in range(1, cp + 1) if cp % u == 0 and u * u <= cp)


# --- differentiable exchanges ------------------------------------------------------------------

def _sendrecv(x: torch.Tensor, dst: int, src: int) -> torch.Tensor:
    """Send ``x`` to global rank ``dst`` while receiving a tensor like it from ``src``."""
    out = torch.empty_like(x)
    x = x.contiguous()
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, dst), dist.P2POp(dist.irecv, out, src)])
    for r in reqs:
        r.wait()
    return out


class _Shift(torch.autograd.Function):
    """Ring step: forward receives from ``src`` what it sends to ``dst``; backward the reverse."""

    @staticmethod
    def forward(ctx, x, dst: int, src: int):
        ctx.dst, ctx.src = dst, src
        return _sendrecv(x, dst, src)

    @staticmethod
    def backward(ctx, grad):
        return _sendrecv(grad, ctx.src, ctx.dst), None, None


class _AllToAll(torch.autograd.Function):
    """Split ``x`` into n parts along ``scatter``, part j to group rank j, concatenate along ``gather``."""

    @staticmethod
    def forward(ctx, x, group, scatter: int, gather: int):
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return _all_to_all(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.gather, ctx.scatter), None, None, None


def _all_to_all(x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
    n = dist.get_world_size(group)
    send = torch.stack(x.chunk(n, scatter)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), gather)


# --- attention on chunks ----------------------------------------------------------------------------

def block_attention(q, k, v, q_pos, k_pos, scale: float, dropout: float):
    """Causal attention of q [b,h,sq,d] on one K/V block [b,h,sk,d] given token positions:
    (output [b,h,sq,d], log-sum-exp [b,h,sq]); None when every key is in every query's future."""
    visible = k_pos[None, :] <= q_pos[:, None]
    if not bool(visible.any()):
        return None
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~visible, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    if dropout > 0:
        probs = F.dropout(probs, dropout)
    return probs @ v, lse


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """o = Σ_j exp(lse_j − lse)·o_j with lse = logsumexp_j lse_j."""
    lses = torch.stack([lse for _, lse in parts])
    total = torch.logsumexp(lses, dim=0)
    return sum(torch.exp(lse - total).unsqueeze(-1) * o for o, lse in parts)  # type: ignore[return-value]  # parts: ≥ 1


@dataclass(frozen=True)
class CPGroups:
    """This rank's context-parallel exchange: Ulysses within ``ulysses_group`` (u ranks), ring
    over ``ring`` (global ranks, in cp order) of ring size r = cp / u."""

    cp: int
    cp_rank: int
    ulysses: int
    ulysses_group: object | None
    ring: tuple[int, ...]
    ring_index: int


def build_groups(plan, rank: int) -> CPGroups:
    """The cp exchange groups of ``rank`` (``new_group`` is collective: every rank calls this)."""
    from autoplan.mesh import Mesh

    mesh = Mesh.of(plan)
    cp = plan.cp
    u = {"ring": 1, "ulysses": cp, "usp": plan.ulysses or usp_split(cp)}[plan.cp_algo]
    mine = mesh.group("cp", rank)
    group = None
    for ranks in mesh.groups("cp"):
        for start in range(0, cp, u):
            sub = list(ranks[start:start + u])
            pg = dist.new_group(sub) if u > 1 else None
            if rank in sub:
                group = pg
    index = mine.index(rank)
    ring = tuple(mine[index % u::u])
    return CPGroups(cp=cp, cp_rank=index, ulysses=u, ulysses_group=group, ring=ring, ring_index=index // u)


def cp_attention(q, k, v, g: CPGroups, scale: float, dropout: float) -> torch.Tensor:
    """Causal attention of this rank's tokens (local q, k, v [b, h, S/cp, d]) over the whole sequence."""
    heads = q.shape[1]
    if k.shape[1] != heads:                                    # GQA: every query head its K/V
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    length = q.shape[2] // 2                                   # tokens per chunk
    u = g.ulysses
    if heads % u:
        raise UserError(f"Ulysses over {u} cp ranks needs the heads on a rank ({heads}) to divide by {u}",
                        "use cp_algo=ring, or fewer cp ranks for Ulysses")
    members = [g.ring_index * u + j for j in range(u)]         # cp ranks of my Ulysses group
    if u > 1:
        q, k, v = (_AllToAll.apply(t, g.ulysses_group, 1, 2) for t in (q, k, v))
    mine = tuple(c for m in members for c in chunks_of(m, g.cp))
    q_pos = chunk_positions(mine, length, q.device)
    r, i = len(g.ring), g.ring_index
    parts = []
    for step in range(r):
        owner = (i - step) % r                                 # ring index whose K/V we hold now
        chunks = tuple(c for j in range(u) for c in chunks_of(owner * u + j, g.cp))
        part = block_attention(q, k, v, q_pos, chunk_positions(chunks, length, q.device), scale, dropout)
        if part is not None:
            parts.append(part)
        if step < r - 1:                                       # K and V in one message
            kv = _Shift.apply(torch.stack((k, v)), g.ring[(i + 1) % r], g.ring[(i - 1) % r])
            k, v = kv.unbind(0)
    out = merge(parts)
    if u > 1:
        out = _AllToAll.apply(out, g.ulysses_group, 2, 1)
    return out


# --- capacity-routed MoE under cp: the whole sequence's expert queues -------------------------

class CapacityMoE(Protocol):
    """What a ``SequenceQueue`` reads of its MoE module (the zoo's capacity-routed MoE)."""

    topk: int
    experts: int

    def capacity(self, tokens: int) -> int: ...


@dataclass(frozen=True)
class SequenceQueue:
    """A capacity-routed MoE's ``queue`` hook under cp (``autoplan.zoo.moe.MoE.queue``).

    One process ranks the k·T choices of a micro-batch k-major, token by token (T = b·S, row
    by row, position by position), and drops a choice whose place in its expert's queue is
    ≥ C = ceil(b·S·k/E · capacity_factor).  A cp rank holds chunks i and 2cp−1−i of each row,
    so a choice's place is: the choices of its expert in every (level, row, chunk) before its
    own, summed over the cp ranks' counts (one ``all_gather`` of k·b·2·E integers), plus its
    running count inside its chunk.  The capacity is that of the whole sequence (cp × the
    local one's tokens), so the rank's buffer has C slots per expert.
    """

    cp: int
    cp_rank: int
    group: object            # the whole cp group
    length: int              # tokens per chunk, S / (2·cp)
    model: CapacityMoE       # the MoE module

    def __call__(self, onehot: torch.Tensor, position: torch.Tensor, cap: int) -> tuple[torch.Tensor, int]:
        k, experts, length = self.model.topk, self.model.experts, self.length
        choices = onehot.view(k, -1, 2, length, experts)                             # [k, b, 2, L, E]
        rows = choices.shape[1]
        within = ((torch.cumsum(choices, dim=3) - 1) * choices).sum(dim=-1)          # [k, b, 2, L]
        counts = choices.sum(dim=3).contiguous()                                      # [k, b, 2, E]
        gathered = [torch.empty_like(counts) for _ in range(self.cp)]
        dist.all_gather(gathered, counts, group=self.group)
        every = counts.new_zeros(k, rows, 2 * self.cp, experts)
        for r, part in enumerate(gathered):
            every[:, :, list(chunks_of(r, self.cp))] = part
        flat = every.view(-1, experts)
        before = (torch.cumsum(flat, dim=0) - flat).view_as(every)[:, :, list(chunks_of(self.cp_rank, self.cp))]
        place = (before.unsqueeze(3) * choices).sum(dim=-1) + within                 # [k, b, 2, L]
        return place.reshape(-1), self.model.capacity(rows * 2 * length * self.cp)


def route_whole_sequence(module: torch.nn.Module, cp: int, cp_rank: int, group, seq: int) -> int:
    """Give every capacity-routed MoE in ``module`` (one with ``capacity`` and ``queue``, as the
    zoo's) the whole sequence's queue (``SequenceQueue``); returns how many were found."""
    found = 0
    for m in module.modules():
        if callable(getattr(m, "capacity", None)) and callable(getattr(m, "queue", None)):
            # ignore: nn.Module types attributes Tensor | Module; m is a CapacityMoE, found by duck typing
            m.queue = SequenceQueue(cp, cp_rank, group, seq // (2 * cp), m)  # type: ignore[assignment,arg-type]
            found += 1
    return found


def check_model(model) -> None:
    """The model's forward must take ``position_ids`` (each cp rank's tokens sit at their own positions)."""
    import inspect

    if "position_ids" not in inspect.signature(model.forward).parameters:
        raise UserError(f"context parallelism passes each rank's token positions as position_ids, and "
                        f"{type(model).__name__}.forward takes no position_ids argument",
                        "add `position_ids=None` to forward and use it for positions/rotary tables, or cp=1")


# --- torch's own context_parallel where it covers the call (CUDA) -------------------------------

def torch_declines(device_type: str, ulysses: int, tensor_parallel: bool, q_heads: int, kv_heads: int,
                   dropout: float, enable_gqa: bool) -> str:
    """Why torch's ``context_parallel`` cannot run this attention call ('' when it can).

    torch 2.13's CP (``torch.distributed.tensor.experimental``) is ring attention on CUDA SDPA
    kernels (flash, efficient, cuDNN) over plain tensors sharded on one cp DeviceMesh, with the
    head-tail load balancing this module uses (rank i: chunks i and 2cp−1−i).  It has no
    Ulysses/USP, takes no tp-sharded DTensor (its input hook asserts Shard(seq) placements), no
    grouped K/V heads and no dropout in the ring merge.
    """
    if device_type != "cuda":
        return f"torch's context_parallel runs on CUDA attention kernels, not {device_type}"
    if ulysses > 1:
        return "torch's context_parallel is ring attention only (no Ulysses all-to-all)"
    if tensor_parallel:
        return "torch's context_parallel takes plain tensors, not tp-sharded DTensors"
    if enable_gqa or kv_heads != q_heads:
        return f"torch's ring attention needs as many K/V heads as query heads ({kv_heads} vs {q_heads})"
    if dropout > 0:
        return "torch's ring attention merges blocks without attention dropout"
    return ""


def torch_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, cp_mesh) -> torch.Tensor:
    """Causal attention of this rank's tokens by torch's ``context_parallel`` on ``cp_mesh``.

    The context shards a one-row marker of the whole sequence only to switch on its head-tail
    load balancing (the inputs here are already this rank's two chunks), then its patched
    ``F.scaled_dot_product_attention`` runs the ring on local q, k, v [b, h, S/cp, d]."""
    from torch.distributed.tensor.experimental import context_parallel

    marker = torch.empty(1, q.shape[2] * cp_mesh.size(), device=q.device)
    with context_parallel(cp_mesh, buffers=[marker], buffer_seq_dims=[1], no_restore_buffers={marker}):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


class ContextParallelAttention(TorchFunctionMode):
    """While active, causal ``F.scaled_dot_product_attention`` runs as ``cp_attention``, or as
    torch's ``context_parallel`` where ``torch_declines`` finds nothing against it (CUDA, ring,
    no tp, no GQA, no dropout; ``cp_mesh`` given)."""

    def __init__(self, groups: CPGroups, cp_mesh=None) -> None:
        super().__init__()
        self.groups = groups
        self.cp_mesh = cp_mesh

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        call = dict(zip(names, args), **kwargs)
        if call.get("attn_mask") is not None or not call.get("is_causal", False):
            raise UserError("context parallelism runs causal attention without an explicit mask; this model "
                            "passes a mask to scaled_dot_product_attention",
                            "use is_causal=True without attn_mask (transformers: no padding mask), or cp=1")
        q, k, v = call["query"], call["key"], call["value"]
        scale = call.get("scale") or 1.0 / math.sqrt(q.shape[-1])
        dropout = call.get("dropout_p", 0.0) or 0.0
        if self.cp_mesh is not None and not torch_declines(q.device.type, self.groups.ulysses, isinstance(q, DTensor),
                                                           q.shape[1], k.shape[1], dropout,
                                                           bool(call.get("enable_gqa", False))):
            return torch_ring_attention(q, k, v, scale, self.cp_mesh)
        if isinstance(q, DTensor):
            mesh, placements = q.device_mesh, q.placements
            out = cp_attention(q.to_local(), k.to_local(), v.to_local(), self.groups, scale, dropout)
            return DTensor.from_local(out, mesh, placements, run_check=False)
        return cp_attention(q, k, v, self.groups, scale, dropout)
