"""Models as the tracer runs them: no KV cache, logits read from whatever the model returns.

``autoplan search`` traces a model with ``config.use_cache = False`` and reads its
logits from the output (a tensor, or an object's ``.logits`` such as transformers'
``CausalLMOutputWithPast``, or its first tensor); ``apply`` and the single-process
reference run the same way, so a plain ``LlamaForCausalLM`` runs without a wrapper.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autoplan.frontend.regions import model_logits


def training_config(model: nn.Module) -> nn.Module:
    """Turn a transformers model's KV cache off (training keeps no cache) and run its MoE experts
    with ``batched_mm`` instead of ``grouped_mm``; returns the model.

    ``torch._grouped_mm``'s shape function accepts bf16 only (a CUDA kernel constraint), so
    DTensor cannot propagate shardings through it in fp32; ``batched_mm`` computes the same
    expert GEMMs (a per-choice gather of the expert weights and a batched matmul).
    """
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False
    if (getattr(config, "_experts_implementation", None) == "grouped_mm"
            and hasattr(model, "set_experts_implementation")):
        model.set_experts_implementation("batched_mm")  # type: ignore[operator]  # hasattr above: a method
    return model


def logits_of(output: Any) -> torch.Tensor:
    """The logits a model returned: the tensor itself, ``.logits``, or the first tensor inside."""
    value = model_logits(output)
    if value is None:
        raise TypeError(f"the model returned {type(output).__name__}, which holds no logits tensor")
    return value
