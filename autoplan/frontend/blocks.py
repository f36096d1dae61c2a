"""Find the repeated blocks of a model by structure, not by name.

A *stack* is an ``nn.ModuleList`` (or ``nn.Sequential``) of layers.  The
main stack is the one whose children hold the most parameters — the decoder
layers of every transformer.  Encoder-decoder models (T5, BART) and models
with a second tower have more: every other container, neither inside nor
around one already taken, that holds at least ``MIN_STACK_SHARE`` of the
main stack's parameters is a stack too.  The *layer stack* is all stacks'
layers in module order (encoder before decoder, as they run), and
``LayerStack.stacks`` keeps where each one starts.

Two layers are the same *kind* when their structural signatures match: the
module class tree, every parameter's relative name, shape and dtype, and the
attention attributes that change what a layer computes without changing its
parameters (``ATTENTION_ATTRS``: Gemma 2 alternates sliding-window and
global layers of identical weights).  Kinds are named by what they contain
and numbered in order of first appearance: ``dense0``, ``moe0``,
``dense1``... (``moe`` when the block holds a parameter with 3 or more dims,
i.e. batched experts, or a module whose class name mentions experts).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch import nn

MIN_STACK_SHARE = 0.2
ATTENTION_ATTRS = ("sliding_window", "layer_type", "attention_type", "is_sliding", "is_causal")


@dataclass(frozen=True)
class LayerStack:
    """The repeated layers: their container paths, instances, paths and kinds.

    ``path`` is the main stack's container; ``stacks`` lists every stack as
    (container path, index of its first layer in ``layers``), in order.
    """

    path: str
    layers: tuple[nn.Module, ...]
    paths: tuple[str, ...]
    kinds: tuple[str, ...]
    stacks: tuple[tuple[str, int], ...] = ()

    def first_index(self, kind: str) -> int:
        return self.kinds.index(kind)

    def unique_kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.kinds))

    def stack_ranges(self) -> tuple[range, ...]:
        """Layer indices of each stack (one range covering all layers for a single stack)."""
        starts = [i for _, i in self.stacks] or [0]
        ends = starts[1:] + [len(self.layers)]
        return tuple(range(a, b) for a, b in zip(starts, ends))


def _attention_attrs(m: nn.Module) -> str:
    values = (f"{a}={getattr(m, a)!r}" for a in ATTENTION_ATTRS
              if isinstance(getattr(m, a, None), (int, str, bool, float)))
    return ";".join(values)


def structural_signature(module: nn.Module) -> str:
    """A hash of the module class tree with parameter names, shapes, dtypes and attention attributes."""
    def describe(m: nn.Module) -> str:
        params = ",".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in m._parameters.items()
                          if p is not None)
        children = ",".join(f"{n}={describe(c)}" for n, c in m._modules.items() if c is not None)
        return f"{type(m).__module__}.{type(m).__qualname__}[{params}]{{{_attention_attrs(m)}}}({children})"
    return hashlib.sha256(describe(module).encode()).hexdigest()


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_moe(module: nn.Module) -> bool:
    if any(p.dim() >= 3 for p in module.parameters()):
        return True
    return any("expert" in type(m).__name__.lower() or "moe" in type(m).__name__.lower()
               for m in module.modules())


def _containers(model: nn.Module) -> list[tuple[int, str, nn.ModuleList | nn.Sequential]]:
    """(parameters of the children, path, container) of every non-empty layer container, largest first."""
    found = []
    for path, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0:
            continue
        size = sum(_param_count(c) for c in m)
        if size:
            found.append((size, path, m))
    return sorted(found, key=lambda t: (-t[0], t[1].count(".")))


def _nested(a: str, b: str) -> bool:
    return a == b or a == "" or b == "" or a.startswith(b + ".") or b.startswith(a + ".")


def _stacks(model: nn.Module) -> list[tuple[str, nn.ModuleList | nn.Sequential]]:
    """The main stack and the other stacks of at least MIN_STACK_SHARE of its size, in module order."""
    containers = _containers(model)
    if not containers:
        return []
    chosen = [containers[0]]
    for size, path, m in containers[1:]:
        if size >= MIN_STACK_SHARE * chosen[0][0] and not any(_nested(path, p) for _, p, _ in chosen):
            chosen.append((size, path, m))
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    return [(p, m) for _, p, m in sorted(chosen, key=lambda t: order[t[1]])]


def _kinds(layers: tuple[nn.Module, ...]) -> tuple[str, ...]:
    kind_of: dict[str, str] = {}
    counters: dict[str, int] = {}
    kinds = []
    for layer in layers:
        sig = structural_signature(layer)
        if sig not in kind_of:
            prefix = "moe" if _is_moe(layer) else "dense"
            kind_of[sig] = f"{prefix}{counters.get(prefix, 0)}"
            counters[prefix] = counters.get(prefix, 0) + 1
        kinds.append(kind_of[sig])
    return tuple(kinds)


def find_layer_stack(model: nn.Module) -> LayerStack | None:
    """The layer stack of ``model``, or None when it has no ModuleList/Sequential with parameters."""
    stacks = _stacks(model)
    if not stacks:
        return None
    layers: list[nn.Module] = []
    paths: list[str] = []
    starts = []
    for path, container in stacks:
        starts.append((path, len(layers)))
        layers += list(container)
        paths += [f"{path}.{i}" if path else str(i) for i in range(len(container))]
    main = max(stacks, key=lambda s: sum(_param_count(c) for c in s[1]))[0]
    return LayerStack(path=main, layers=tuple(layers), paths=tuple(paths), kinds=_kinds(tuple(layers)),
                      stacks=tuple(starts))
