"""Find the repeated blocks of a model by structure, not by name.

The *layer stack* is the ``nn.ModuleList`` (or ``nn.Sequential``) whose
children hold the most parameters — the decoder layers of every transformer.
Two layers are the same *kind* when their structural signatures match: the
module class tree, and every parameter's relative name, shape and dtype.
Kinds are named by what they contain and numbered in order of first
appearance: ``dense0``, ``moe0``, ``dense1``... (``moe`` when the block holds
a parameter with 3 or more dims, i.e. batched experts, or a module whose
class name mentions experts).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class LayerStack:
    """The repeated layers: their container path, instances, paths and kinds."""

    path: str
    layers: tuple[nn.Module, ...]
    paths: tuple[str, ...]
    kinds: tuple[str, ...]

    def first_index(self, kind: str) -> int:
        return self.kinds.index(kind)

    def unique_kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.kinds))


def structural_signature(module: nn.Module) -> str:
    """A hash of the module class tree with parameter names, shapes and dtypes."""
    def describe(m: nn.Module) -> str:
        params = ",".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in m._parameters.items()
                          if p is not None)
        children = ",".join(f"{n}={describe(c)}" for n, c in m._modules.items() if c is not None)
        return f"{type(m).__module__}.{type(m).__qualname__}[{params}]({children})"
    return hashlib.sha256(describe(module).encode()).hexdigest()


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_moe(module: nn.Module) -> bool:
    if any(p.dim() >= 3 for p in module.parameters()):
        return True
    return any("expert" in type(m).__name__.lower() or "moe" in type(m).__name__.lower()
               for m in module.modules())


def find_layer_stack(model: nn.Module) -> LayerStack | None:
    """The layer stack of ``model``, or None when it has no ModuleList/Sequential with parameters."""
    best: tuple[int, int, str, nn.Module] | None = None
    for path, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0:
            continue
        size = sum(_param_count(c) for c in m)
        if size == 0:
            continue
        key = (size, -path.count("."), path, m)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return None
    path, container = best[2], best[3]
    layers = tuple(container)
    paths = tuple(f"{path}.{i}" if path else str(i) for i in range(len(layers)))
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
    return LayerStack(path=path, layers=layers, paths=paths, kinds=tuple(kinds))
