"""Sizes of a traced tensor on one GPU: micro-batch ``mbs``, ``1/cp`` of the sequence, ``1/tp`` if sharded.

The block is traced at micro-batch 1 and the whole sequence; dims carry roles
(``ir.TensorInfo.dim_roles``).  A ``batch`` dim scales with ``mbs``; the first sequence dim
(``seq``, or a flattened ``tokens`` dim, which also scales with ``mbs``) is divided by ``cp``.
"""
from __future__ import annotations

from autoplan.ir import TensorInfo
from autoplan.sharding.placements import is_shard

SEQ_ROLES = ("seq", "tokens")


def scaled_numel(t: TensorInfo, mbs: int, cp: int) -> float:
    """Elements of ``t`` on one GPU before tp sharding (micro-batch mbs, 1/cp of the sequence)."""
    n = float(t.numel)
    seen_seq = False
    for role in t.dim_roles:
        if role in ("batch",):
            n *= mbs
        elif role == "tokens":
            n *= mbs / (1 if seen_seq else cp)
            seen_seq = True
        elif role == "seq" and not seen_seq:
            n /= cp
            seen_seq = True
    return n


def local_dim(t: TensorInfo, d: int, mbs: int, cp: int) -> float:
    return scaled_dim(t.shape[d], t.dim_roles[d] if d < len(t.dim_roles) else "", mbs, cp)


def scaled_dim(size: int, role: str, mbs: int, cp: int) -> float:
    """One dim of ``size`` and ``role`` on one GPU before tp sharding."""
    if role == "batch":
        return size * mbs
    if role == "tokens":
        return size * mbs / cp
    if role == "seq":
        return size / cp
    return size


def bytes_per_elem(t: TensorInfo) -> float:
    return t.nbytes / t.numel if t.numel else 0



def local_bytes(t: TensorInfo, pl: str | None, tp: int, mbs: int, cp: int) -> float:
    """Bytes of ``t`` on one GPU in placement ``pl`` on a tp group of ``tp`` ranks."""
    b = scaled_numel(t, mbs, cp) * bytes_per_elem(t)
    return b / tp if is_shard(pl) else b
