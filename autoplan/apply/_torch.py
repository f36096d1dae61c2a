"""The experimental torch APIs ``apply`` relies on, each behind one small function.

These live in ``torch.distributed.tensor.experimental`` and may change between
torch releases (pyproject pins torch 2.13–2.14); each has a test in
``tests/autoplan/apply/test_torch_apis.py``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.tensor import Replicate, Shard

aten = torch.ops.aten

_CPU_ATTENTION = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
_registered = False


@contextlib.contextmanager
def plain_tensors_are_replicated() -> Iterator[None]:
    """Inside, an op mixing DTensors and plain tensors treats the plain ones as replicated.

    ``apply`` keeps every sharded activation a DTensor, so the plain tensors a model
    builds on the fly (causal masks, rotary tables, position ids) really are the
    same on every tp rank.  Wraps ``implicit_replication`` (experimental).
    """
    from torch.distributed.tensor.experimental import implicit_replication

    with implicit_replication():
        yield


def register_cpu_attention_sharding() -> None:
    """Teach DTensor to shard the CPU flash-attention kernel by batch or by heads.

    ``F.scaled_dot_product_attention`` on CPU lowers to
    ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward), which has
    no DTensor strategy in torch 2.13.  Attention is independent per (batch, head),
    so q, k, v, the output and the log-sum-exp [b, heads, s] may all be sharded on
    dim 0 or all on dim 1, or all be replicated.  Uses ``register_sharding``
    (experimental); runs once per process.
    """
    global _registered
    if _registered:
        return
    from torch.distributed.tensor.experimental import register_sharding

    forward, backward = _CPU_ATTENTION

    def strategies(args: tuple, outputs: int, attn_mask) -> list:
        """All-replicated, or every tensor (inputs and outputs) sharded on dim 0 or on dim 1."""
        tensor = [not isinstance(a, (bool, int, float)) and a is not None for a in args]
        choices = [Replicate()] + ([Shard(0), Shard(1)] if attn_mask is None else [])
        return [([p] * outputs, [p if t else None for t in tensor]) for p in choices]

    @register_sharding(forward)
    def _forward(*args, attn_mask=None, scale=None):
        return strategies(args, 2, attn_mask)

    @register_sharding(backward)
    def _backward(*args, attn_mask=None, scale=None):
        return strategies(args, 3, attn_mask)

    _registered = True


def flat_mesh(mesh, names: tuple[str, ...]):
    """The 1-D mesh over the named axes of ``mesh`` together (listed in ``mesh``'s order), e.g.
    FSDP's dense group ep·dp under expert parallelism.  ``DeviceMesh._flatten`` is private
    (torch 2.13); a single axis is returned as it is."""
    names = tuple(n for n in mesh.mesh_dim_names if n in names)
    if len(names) == 1:
        return mesh[names[0]]
    return mesh[names]._flatten("_".join(names))
