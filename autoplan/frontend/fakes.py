"""Weights that are never allocated: meta-built modules re-dressed as fake CPU tensors.

A model is built under ``torch.device("meta")`` (no memory), then every
parameter and buffer is swapped for a ``FakeTensor`` on CPU of the same shape
(floating parameters cast to the trace dtype).  Raw meta weights would trace
"successfully" with all-None gradients; fake CPU tensors carry autograd.
Tied weights stay tied: one fake per distinct meta tensor.
"""
from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
               torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
               torch.uint8: "uint8", torch.bool: "bool", torch.float8_e4m3fn: "fp8",
               torch.float8_e5m2: "fp8", torch.uint64: "int64", torch.int16: "int32"}


def dtype_name(dtype: torch.dtype) -> str:
    """IR spelling of a torch dtype ("bf16", "fp32", "int64", ...)."""
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def new_fake_mode() -> FakeTensorMode:
    """A fake mode that also accepts tensors created outside it (e.g. Python constants)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_like(t: torch.Tensor, mode: FakeTensorMode, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fake CPU tensor with ``t``'s shape and strides (and ``dtype`` if given)."""
    with mode:
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=dtype or t.dtype,
                                   device="cpu")


def fakeify_module(model: nn.Module, mode: FakeTensorMode, dtype: torch.dtype,
                   skip: tuple[nn.Module, ...] = ()) -> None:
    """Replace, in place, every parameter and buffer of ``model`` by a fake CPU tensor.

    Floating-point parameters become ``dtype``; buffers keep their dtype.  Modules in
    ``skip`` (and their children) keep their meta tensors: the frontend passes the
    layers it never runs (every layer after the first of its kind), so the cost
    stays flat in depth.
    """
    skipped = {id(m) for root in skip for m in root.modules()}
    fakes: dict[int, torch.Tensor] = {}
    for owner in model.modules():
        if id(owner) in skipped:
            continue
        for name, p in list(owner._parameters.items()):
            if p is None:
                continue
            if id(p) not in fakes:
                cast = dtype if p.is_floating_point() else None
                fakes[id(p)] = nn.Parameter(fake_like(p, mode, cast), requires_grad=p.requires_grad)
            owner._parameters[name] = fakes[id(p)]  # type: ignore[assignment]  # the Parameter made above
        for name, b in list(owner._buffers.items()):
            if b is None:
                continue
            if id(b) not in fakes:
                fakes[id(b)] = fake_like(b, mode)
            owner._buffers[name] = fakes[id(b)]


def to_fake(value, mode: FakeTensorMode):
    """Turn meta / real tensors inside ``value`` (any nesting) into fakes; others unchanged."""
    from torch.utils._pytree import tree_map

    def convert(x):
        if isinstance(x, torch.Tensor) and not mode.is_our_fake(x):
            return fake_like(x, mode)
        return x
    return tree_map(convert, value)
