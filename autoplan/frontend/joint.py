"""The joint forward+backward ATen graph of one region, traced on fake tensors.

``make_fx`` records, as ATen ops after autograd, the function

    joint(state, inputs, tangents):
        outputs = region.fn(state, inputs)
        grads   = autograd.grad(differentiable outputs, params + grad-requiring inputs,
                                grad_outputs=tangents)
        return outputs, grads

so the graph's placeholders are, in order: the region's parameters, its
buffers, its inputs, and one *tangent* per differentiable output (the
gradient seed; everything that depends on it is backward).  The output
node lists the region outputs, then the parameter gradients, then the
input gradients (None where a value gets no gradient).  Dead forward ops
(e.g. the embedding in the post region) are removed.  Tracing runs inside
the fake mode, so tensors the model creates (``arange``, masks) are fake too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import GraphModule
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.frontend.fx_meta import module_paths, preserve_node_meta, tag_backward_with_forward_seq_nr
from autoplan.frontend.gpu_kernels import GpuKernels
from autoplan.frontend.hf import training_kernels
from autoplan.frontend.regions import Region


def _mutates(node) -> bool:
    """Only in-place ops are kept when unused (random ops such as dropout are not: the
    post region's stubbed-out embedding dropout is dead)."""
    schema = getattr(node.target, "_schema", None)
    return node.op in ("placeholder", "output") or (schema is not None and schema.is_mutable)


@dataclass
class TracedRegion:
    """A region's joint graph and the meaning of its placeholders and outputs."""

    region: Region
    gm: GraphModule
    n_params: int
    n_buffers: int
    n_inputs: int
    n_tangents: int
    grad_inputs: list[int]      # indices (into region inputs) that get a gradient


def trace_joint(region: Region, mode: FakeTensorMode) -> TracedRegion:
    """Trace ``region`` forward and backward into one ATen graph."""
    n_params = len(region.param_names)
    with mode:
        inputs = [torch.empty(s.shape, dtype=s.dtype, requires_grad=s.requires_grad)
                  for s in region.inputs]
        tangents = [torch.empty(s.shape, dtype=s.dtype)
                    for s, d in zip(region.output_slots, region.diff_outputs) if d]
    grad_inputs = [i for i, s in enumerate(region.inputs) if s.requires_grad]

    def joint(state, inputs, tangents):
        outputs = region.fn(state, inputs)
        diff = [o for o, d in zip(outputs, region.diff_outputs) if d]
        wrt = list(state[:n_params]) + [inputs[i] for i in grad_inputs]
        if not diff or not wrt:
            return outputs, [None] * len(wrt)
        tag_backward_with_forward_seq_nr(diff)
        grads = torch.autograd.grad(diff, wrt, tangents, allow_unused=True)
        return outputs, list(grads)

    with mode, GpuKernels(), training_kernels(), preserve_node_meta(), module_paths(region.module):
        gm = make_fx(joint)(list(region.state), inputs, tangents)
    gm.graph.eliminate_dead_code(is_impure_node=_mutates)
    return TracedRegion(region, gm, n_params, len(region.buffer_names), len(inputs), len(tangents),
                        grad_inputs)
