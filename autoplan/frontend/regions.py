"""Cut a model into regions — pre, one block per kind, post — without running it twice in depth.

1. ``capture``: one fake forward pass.  The first layer of each kind runs
   and its real call arguments (args and kwargs) and output are recorded;
   every later layer of an already-seen kind is short-circuited to return
   the cached output, so the pass costs one layer per kind, whatever the
   depth.
2. Regions are plain functions ``fn(state, inputs) -> outputs`` over flat
   tensor lists (``state`` = parameters then buffers), ready for the joint
   forward+backward trace:

   * **pre**: the model up to the first layer's call; outputs are the
     tensors of that call's arguments (the hidden state, rotary tables,
     masks...).
   * **block** (one per kind): the first layer of the kind, called with
     its captured arguments.
   * **post**: the model with every layer replaced by a stub returning the
     region's input (shaped like the last layer's output of its stack: an
     encoder-decoder's encoder layers return an encoder output, so the
     encoder's final norm lands here too), then the loss.
     Ops that only feed the stubbed layers (the embedding...) are dead and
     removed after tracing.

Loss: a scalar model output is the loss; otherwise logits (the output, its
``.logits``, or its first tensor) get a cross-entropy (in fp32) against
random labels shaped like the logits without the vocabulary dim.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten, tree_unflatten

from autoplan.frontend.blocks import LayerStack
from autoplan.frontend.fx_meta import module_scope


@dataclass(frozen=True)
class TensorSlot:
    """Shape, dtype and grad-requirement of one tensor leaf of a call."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass
class Template:
    """A pytree (call arguments or outputs) with its tensor leaves abstracted to slots."""

    spec: Any
    leaves: list[Any]

    @staticmethod
    def of(value: Any) -> Template:
        leaves, spec = tree_flatten(value)
        return Template(spec, [TensorSlot(tuple(x.shape), x.dtype, bool(x.requires_grad))
                               if isinstance(x, torch.Tensor) else x for x in leaves])

    @property
    def slots(self) -> list[TensorSlot]:
        return [x for x in self.leaves if isinstance(x, TensorSlot)]

    def fill(self, tensors: list[torch.Tensor]) -> Any:
        it = iter(tensors)
        return tree_unflatten([next(it) if isinstance(x, TensorSlot) else x for x in self.leaves],
                              self.spec)


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


@dataclass
class Capture:
    """What one fake forward pass tells: per-kind call/output templates and the loss recipe."""

    calls: dict[str, Template] = field(default_factory=dict)
    outputs: dict[str, Template] = field(default_factory=dict)
    model_inputs: Template = None                # type: ignore[assignment]  # (args, kwargs) of the model call: capture() sets it
    logits_shape: tuple[int, ...] | None = None   # None: the model returns its loss
    loss_dtype: torch.dtype = torch.float32


class _StopAtLayer(Exception):
    """Raised by the first layer in the pre region to end the forward pass there."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.call = (args, kwargs)


@contextlib.contextmanager
def patched_forwards(patches: dict[nn.Module, Callable]):
    """Temporarily replace ``module.forward`` for each module (instance attribute)."""
    for module, fn in patches.items():
        module.forward = fn
    try:
        yield
    finally:
        for module in patches:
            del module.forward


def model_logits(output: Any) -> torch.Tensor | None:
    """The loss (0-d tensor) or logits inside a model output."""
    if isinstance(output, torch.Tensor):
        return output
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    leaves = tensor_leaves(output)
    return leaves[0] if leaves else None


def loss_from_output(output: Any, labels: torch.Tensor | None) -> torch.Tensor:
    """Scalar loss: the output itself if scalar, else fp32 cross-entropy of its logits."""
    # ignore[union-attr]: a traced model returns a tensor (its loss, or logits with labels given)
    value = model_logits(output)
    if value.dim() == 0:  # type: ignore[union-attr]
        return value  # type: ignore[return-value]
    return F.cross_entropy(value.reshape(-1, value.shape[-1]).float(), labels.reshape(-1))  # type: ignore[union-attr]


def capture(model: nn.Module, stack: LayerStack | None, inputs: tuple[tuple, dict]) -> Capture:
    """Run one fake forward pass (one layer per kind) and record the call templates.

    ``inputs`` is the model call's (positional args, keyword args)."""
    cap = Capture(model_inputs=Template.of(inputs))
    cached: dict[str, Any] = {}
    patches = {}
    if stack is not None:
        for i, (layer, kind) in enumerate(zip(stack.layers, stack.kinds)):
            if i == stack.first_index(kind):
                def first(*args, _layer=layer, _kind=kind, _orig=layer.forward, **kwargs):
                    cap.calls[_kind] = Template.of((args, kwargs))
                    out = _orig(*args, **kwargs)
                    cap.outputs[_kind] = Template.of(out)
                    cached[_kind] = out
                    return out
                patches[layer] = first
            else:
                patches[layer] = lambda *a, _kind=kind, **k: cached[_kind]
    args, kwargs = inputs
    with patched_forwards(patches):
        output = model(*args, **kwargs)
    value = model_logits(output)
    if value is None:
        raise ValueError("the model returned no tensor")
    cap.logits_shape = None if value.dim() == 0 else tuple(value.shape)
    cap.loss_dtype = value.dtype if value.dim() == 0 else torch.float32
    return cap


@dataclass
class Region:
    """A traceable function over flat tensor lists, and what its values are."""

    name: str                             # "pre", "post" or a block kind
    module: nn.Module                     # root for module paths
    fn: Callable[[list, list], list]      # (state, inputs) -> outputs
    param_names: list[str]
    buffer_names: list[str]
    state: list[torch.Tensor]             # fake params, then buffers
    inputs: list[TensorSlot]
    diff_outputs: list[bool]              # which outputs get a gradient (a tangent input)
    output_slots: list[TensorSlot]
    loss_output: bool = False             # the first output is the loss


def _state(module: nn.Module, skip: tuple[str, ...] = ()) -> tuple[list[str], list[str], list]:
    def keep(name: str) -> bool:
        return not any(name.startswith(s + ".") for s in skip)
    params = [(n, p) for n, p in module.named_parameters() if keep(n)]
    buffers = [(n, b) for n, b in module.named_buffers() if keep(n)]
    return [n for n, _ in params], [n for n, _ in buffers], [t for _, t in params + buffers]


def block_region(stack: LayerStack, kind: str, cap: Capture) -> Region:
    layer = stack.layers[stack.first_index(kind)]
    call, out = cap.calls[kind], cap.outputs[kind]
    pnames, bnames, state = _state(layer)

    def fn(state_list, inputs):
        args, kwargs = call.fill(inputs)
        return tensor_leaves(functional_call(layer, dict(zip(pnames + bnames, state_list)), args, kwargs))

    return Region(kind, layer, fn, pnames, bnames, state, call.slots,
                  [s.requires_grad for s in out.slots], out.slots)


def pre_region(model: nn.Module, stack: LayerStack, cap: Capture) -> Region:
    first = stack.layers[0]
    pnames, bnames, state = _state(model, skip=stack.paths)
    call = cap.calls[stack.kinds[0]]

    def stop(*args, **kwargs):
        raise _StopAtLayer(args, kwargs)

    def fn(state_list, inputs):
        with patched_forwards({first: stop}):
            try:
                functional_call(model, dict(zip(pnames + bnames, state_list)),
                                *cap.model_inputs.fill(inputs))
            except _StopAtLayer as s:
                return tensor_leaves(s.call)
        raise RuntimeError("the model never called its first layer")

    return Region("pre", model, fn, pnames, bnames, state, cap.model_inputs.slots,
                  [s.requires_grad for s in call.slots], call.slots)


def _stub_outputs(stack: LayerStack, cap: Capture) -> list[tuple[range, Template]]:
    """Per stack (the last stack first): its layers and the output template of its last layer."""
    ranges = stack.stack_ranges()
    ordered = [ranges[-1]] + list(ranges[:-1])
    return [(r, cap.outputs[stack.kinds[r[-1]]]) for r in ordered if len(r)]


def _handoff_slots(stack: LayerStack | None, cap: Capture) -> list[tuple[int, list[bool]]]:
    """Per later stack: (its first layer, which of that call's tensors get a gradient).

    What the model computes between stacks (an encoder's final norm, the decoder's
    embedding) runs in post and reaches the later stack's layers as these tensors."""
    if stack is None:
        return []
    return [(r[0], [s.requires_grad for s in cap.calls[stack.kinds[r[0]]].slots])
            for r in stack.stack_ranges()[1:] if len(r)]


def post_region(model: nn.Module, stack: LayerStack | None, cap: Capture) -> Region:
    """The model outside its layers; outputs: the loss, then the tensors handed to later stacks."""
    pnames, bnames, state = _state(model, skip=stack.paths if stack is not None else ())
    n_model_inputs = len(cap.model_inputs.slots)
    stubs = _stub_outputs(stack, cap) if stack is not None else []
    handoffs = _handoff_slots(stack, cap)
    slots = list(cap.model_inputs.slots) + [s for _, out in stubs for s in out.slots]
    if cap.logits_shape is not None:
        slots.append(TensorSlot(cap.logits_shape[:-1], torch.int64, False))

    def fn(state_list, inputs):
        model_inputs = inputs[:n_model_inputs]
        rest = inputs[n_model_inputs:]
        patches, handed = {}, {}
        for layers, out in stubs:
            layer_out = out.fill(rest[:len(out.slots)])
            rest = rest[len(out.slots):]
            patches.update({stack.layers[i]: (lambda *a, _out=layer_out, **k: _out) for i in layers})
        for first, _ in handoffs:
            def record(*args, _first=first, _out=patches[stack.layers[first]], **kwargs):
                handed[_first] = tensor_leaves((args, kwargs))
                return _out()
            patches[stack.layers[first]] = record
        with patched_forwards(patches):
            output = functional_call(model, dict(zip(pnames + bnames, state_list)),
                                     *cap.model_inputs.fill(model_inputs))
        labels = rest[-1] if cap.logits_shape is not None else None
        with module_scope("loss"):
            loss = loss_from_output(output, labels)
        return [loss] + [t for first, grad in handoffs for t, g in zip(handed[first], grad) if g]

    handoff_slots = [s for first, _ in handoffs for s in cap.calls[stack.kinds[first]].slots  # type: ignore[union-attr]
                     if s.requires_grad]                             # handoffs: a stack
    loss_slot = TensorSlot((), cap.loss_dtype, True)
    outputs = [loss_slot] + handoff_slots
    return Region("post", model, fn, pnames, bnames, state, slots, [True] * len(outputs), outputs,
                  loss_output=True)
