"""Module paths on traced nodes (torch.fx node-meta internals, each behind one function).

Forward nodes get the path of the innermost module that ran them, through
forward hooks that enter ``torch.fx.traceback.annotate({"module": path})``
(recorded in ``node.meta["custom"]`` while node meta is preserved); nodes
of sliding-window attention also carry their window (``attention_window``).
Backward nodes get the autograd sequence number of the forward op they
differentiate (``node.meta["seq_nr"]``) and a backward mark
(``node.meta["autograd_backward"]``), through pre/post hooks on the
autograd graph — what AOTAutograd does for stack traces; the converter
maps the number back to the forward node's module.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.fx import traceback as fx_traceback


@contextlib.contextmanager
def preserve_node_meta() -> Iterator[None]:
    """Record annotations and sequence numbers on nodes created inside (make_fx)."""
    with fx_traceback.preserve_node_meta():
        yield


@contextlib.contextmanager
def module_scope(path: str) -> Iterator[None]:
    """Nodes created inside get ``module == path``."""
    with fx_traceback.annotate({"module": path}):
        yield


@contextlib.contextmanager
def module_paths(root: nn.Module) -> Iterator[None]:
    """While active, nodes created inside a submodule's forward get its path (relative to root)."""
    open_scopes: list[contextlib.AbstractContextManager] = []

    def enter(name: str):
        def hook(module, args):
            scope = module_scope(name)
            scope.__enter__()
            open_scopes.append(scope)
        return hook

    def leave(module, args, output):
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    handles = []
    for name, sub in root.named_modules():
        handles.append(sub.register_forward_pre_hook(enter(name)))
        handles.append(sub.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        while open_scopes:
            open_scopes.pop().__exit__(None, None, None)


@contextlib.contextmanager
def attention_window(window: int) -> Iterator[None]:
    """Nodes created inside belong to causal attention with a sliding window of ``window`` keys."""
    with fx_traceback.annotate({"attention_window": window}):
        yield


def node_attention_window(node: torch.fx.Node) -> int:
    """The sliding window recorded on a forward node (0: full attention)."""
    custom = node.meta.get("custom") or {}
    return int(custom.get("attention_window", 0))


def node_module(node: torch.fx.Node) -> str | None:
    """The module path recorded on a forward node (None if none)."""
    custom = node.meta.get("custom") or {}
    return custom.get("module")


def node_seq_nr(node: torch.fx.Node) -> int | None:
    """Autograd sequence number shared by a forward op and the backward ops that differentiate it."""
    return node.meta.get("seq_nr")


def created_in_backward(node: torch.fx.Node) -> bool:
    """True if the node was recorded while autograd ran a backward function."""
    return bool(node.meta.get("autograd_backward"))


def tag_backward_with_forward_seq_nr(outputs: list[torch.Tensor]) -> None:
    """Make backward nodes carry the ``seq_nr`` of the forward op they differentiate."""
    seen: set = set()
    todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        seq = fn._sequence_nr()

        def pre(grad_outputs, seq=seq):
            fx_traceback.set_grad_fn_seq_nr(seq)
            fx_traceback._mark_autograd_backward()

        def post(grad_inputs, grad_outputs):
            fx_traceback.reset_grad_fn_seq_nr()
            fx_traceback._reset_autograd_backward()

        fn.register_prehook(pre)
        fn.register_hook(post)
        todo.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
