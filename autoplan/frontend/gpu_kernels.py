"""Make a CPU trace record the kernels a GPU run would use.

On a CPU build, ``F.scaled_dot_product_attention`` lowers to
``_scaled_dot_product_flash_attention_for_cpu`` (no DTensor strategy, no
FLOP formula) and ``F.dropout`` to ``bernoulli_`` + ``mul`` (a 2-byte mask).
``GpuKernels`` is a ``TorchFunctionMode`` that, while tracing, redirects

* SDPA without a mask → ``aten._scaled_dot_product_flash_attention``
  (grouped-query k/v passed as they are, as FlashAttention-2 takes them);
* SDPA with a mask, or with a value head size other than the query/key
  head size (MLA: DeepSeek-V2/V3 have q/k 192, v 128, which the flash
  kernel refuses) → ``aten._scaled_dot_product_efficient_attention``, the
  kernel torch's SDPA dispatches to on a GPU (boolean masks become an
  additive bias; k/v heads repeated for GQA; the output has the value head
  size);
* dropout            → ``aten.native_dropout`` (1-byte boolean mask, as on GPU);
* concatenation      → without its empty operands (Phi-3's rotary keeps the
  "pass-through" part ``q[..., head_dim:]`` of size 0 and concatenates it;
  such a tensor moves no data, and a dim of size 0 is not a dim a plan can
  shard);
* RMSNorm            → the fused kernel (saves the input and an fp32 rstd, as
  CUDA's ``_fused_rms_norm`` does; on CPU ``F.rms_norm`` decomposes into
  fp32 copies that would double the saved activations).

These ops have meta kernels, autograd formulas, FLOP formulas in
``torch.utils.flop_counter`` and DTensor sharding strategies.  ``aten`` has
no single-op fused RMSNorm on CPU (``_fused_rms_norm`` is a composite), so
the forward is the custom op ``autoplan::fused_rms_norm`` (same schema),
reported in the IR as ``aten._fused_rms_norm.default`` (``ATEN_EQUIVALENT``);
its backward is the real ``aten._fused_rms_norm_backward``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


@torch.library.custom_op("autoplan::fused_rms_norm", mutates_args=())
def fused_rms_norm(input: torch.Tensor, normalized_shape: list[int],  # noqa: A002 (aten's name)
                   weight: torch.Tensor | None, eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm returning (output, rstd) — the schema of ``aten._fused_rms_norm``."""
    out, rstd = aten._fused_rms_norm(input, normalized_shape, weight, eps)
    return out.clone(), rstd.clone()


@fused_rms_norm.register_fake
def _fused_rms_norm_fake(input, normalized_shape, weight, eps):  # noqa: A002
    n = len(normalized_shape)
    stats = tuple(input.shape[:input.dim() - n]) + (1,) * n
    return torch.empty_like(input), input.new_empty(stats, dtype=torch.float32)


def _fused_rms_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, _ = inputs
    ctx.save_for_backward(x, output[1], weight)
    ctx.normalized_shape = normalized_shape


def _fused_rms_norm_backward(ctx, grad_out, grad_rstd):
    x, rstd, weight = ctx.saved_tensors
    grad_x, grad_w = aten._fused_rms_norm_backward(grad_out, x, ctx.normalized_shape, rstd, weight,
                                                    [True, weight is not None])
    return grad_x, None, grad_w if weight is not None else None, None


fused_rms_norm.register_autograd(_fused_rms_norm_backward, setup_context=_fused_rms_norm_setup)

ATEN_EQUIVALENT = {torch.ops.autoplan.fused_rms_norm.default: aten._fused_rms_norm.default}


def aten_op(target):
    """The ATen op a traced target stands for (itself unless it is one of ours)."""
    return ATEN_EQUIVALENT.get(target, target)


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _dropout_args(input, p=0.5, training=True, inplace=False):  # noqa: A002 (torch's name)
    return input, p, training


def _rms_norm_args(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    return input, normalized_shape, weight, eps


def gpu_rms_norm(x: torch.Tensor, normalized_shape, weight, eps) -> torch.Tensor:
    """RMSNorm as one fused op (see module docstring)."""
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return torch.ops.autoplan.fused_rms_norm(x, list(normalized_shape), weight, eps)[0]


def gpu_attention(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """Scaled dot-product attention as the GPU flash / memory-efficient kernel."""
    same_head_dim = value.shape[-1] == query.shape[-1]
    if attn_mask is None and same_head_dim:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                        False, scale=scale)[0]
    heads = query.shape[1]
    if key.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    if attn_mask is None:
        return aten._scaled_dot_product_efficient_attention(query, key, value, None, True, dropout_p,
                                                            is_causal, scale=scale)[0]
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
        attn_mask = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
    shape = (query.shape[0], heads, query.shape[2], key.shape[2])
    attn_mask = attn_mask.to(query.dtype).expand(shape)
    return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p,
                                                        is_causal, scale=scale)[0]


def gpu_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout as ``native_dropout`` (boolean mask saved for backward)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0
    return aten.native_dropout(x, p, True)[0]


_CATS = (torch.cat, torch.concat, torch.concatenate)


def _cat_args(tensors, dim=0, *, out=None):
    return tensors, dim, out


def without_empty_operands(func, args, kwargs):
    """``torch.cat`` without its zero-element operands (all of them kept when all are empty)."""
    tensors, dim, out = _cat_args(*args, **kwargs)
    kept = [t for t in tensors if t.numel() > 0]
    if out is not None or len(kept) in (0, len(tensors)):
        return func(*args, **kwargs)
    return func(kept, dim)


class GpuKernels(TorchFunctionMode):
    """Redirect SDPA, dropout, RMSNorm and concatenation to their GPU kernels while active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v, mask, p, causal, scale, _ = _sdpa_args(*args, **kwargs)
            return gpu_attention(q, k, v, mask, p, causal, scale)
        if func is F.dropout:
            x, p, training = _dropout_args(*args, **kwargs)
            return gpu_dropout(x, p, training)
        if func is F.rms_norm:
            return gpu_rms_norm(*_rms_norm_args(*args, **kwargs))
        if func in _CATS:
            return without_empty_operands(func, args, kwargs)
        return func(*args, **kwargs)
