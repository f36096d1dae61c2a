"""Placements on the tp axis and the collective that turns one into another.

Spelling (as DTensor prints them): ``"R"`` replicate, ``"S(d)"`` shard tensor dim d,
``"P"`` partial sum.  Redistribution of a tensor whose full size is F bytes over a
tp group of size t (nccl-tests byte conventions):

===========  ===========  ==================  ==========================
from         to           collective          bytes argument
===========  ===========  ==================  ==========================
R            S(d) or P    none (local slice)  0
S(d)         R            all_gather          F (output size)
S(d)         S(e), e≠d    all_to_all          F / t (per-rank send)
S(d)         P            all_gather          F
P            R            all_reduce          F
P            S(d)         reduce_scatter      F (input size)
===========  ===========  ==================  ==========================
"""
from __future__ import annotations

import re

_SHARD = re.compile(r"^S\((-?\d+)\)$")


def shard_dim(placement: str | None) -> int | None:
    """The tensor dim of ``"S(d)"``, else None."""
    if not placement:
        return None
    m = _SHARD.match(placement)
    return int(m.group(1)) if m else None


def is_shard(placement: str | None) -> bool:
    return shard_dim(placement) is not None


def redistribution(src: str, dst: str) -> str | None:
    """Collective kind that turns ``src`` into ``dst``, or None when it is free."""
    if src == dst or src == "R":
        return None
    if src == "P":
        return "all_reduce" if dst == "R" else "reduce_scatter"
    # src is a shard
    if dst == "R" or dst == "P":
        return "all_gather"
    return "all_to_all"


def redistribution_bytes(kind: str, full_bytes: float, group: int) -> float:
    """The nccl-tests size argument of ``kind`` for a tensor of ``full_bytes``."""
    return full_bytes / group if kind == "all_to_all" else full_bytes
