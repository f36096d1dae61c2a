"""A traced joint graph (torch.fx) → an ``OpGraph`` of plain dataclasses.

Per node: output shapes, dtypes and dim roles; FLOPs, bytes, GEMM shape and
view-ness (``costs``); phase, role, saved, wgrad and module path; and the
tp strategies (``dtensor_strategies``).  ``getitem`` nodes disappear: a
consumer of output i of a multi-output op refers to ``TensorRef(op, i)``.

Conventions
-----------
* Placeholders, in graph order: parameters (role ``param``, ``param`` = name
  relative to the region's root module), buffers (role ``buffer``, ``param``
  = buffer name), inputs, tangents (role ``tangent``, one per differentiable
  output).  An input is ``input`` when it gets a gradient (the activation
  stream) or is a model input of the pre region (token ids), else
  ``side_input`` (rotary tables, masks, labels).  Placeholders no op uses
  are dropped.
* ``phase``: ``backward`` for nodes recorded while autograd ran a backward
  function or that depend on a tangent; ``forward`` otherwise.
* ``saved`` / ``saved_outputs``: forward values read by a backward node,
  followed through views to the tensor that owns the storage (a view of a
  saved activation marks the activation, a transposed weight marks the
  parameter placeholder).
* ``attention_window``: the sliding window of an SDPA kernel (forward, and
  its backward through the autograd sequence number), 0 for full attention;
  the kernel's FLOPs are scaled to the band (``costs.window_fraction``).
* ``attention_causal``: the SDPA kernel's ``is_causal`` argument; FLOPs stay at
  full s² (the MFU convention), the cost model prices the kernel's real work.
* ``wgrad``: backward nodes that do not feed any input gradient (they only
  produce parameter gradients).
* roles: ``param_grad`` for single-output nodes the output lists as
  parameter gradients (``param`` = the parameter; a norm backward that
  returns input and weight gradients keeps ``grad`` — ``output_roles`` is
  the authority), ``loss`` for the post region's loss, ``activation`` /
  ``grad`` for other forward / backward nodes.
* the ``output`` node's inputs: the region outputs, then parameter
  gradients (parameter order), then input gradients; None entries omitted.
  ``OpGraph.output_roles`` labels each: ``activation`` (or ``loss``),
  ``param_grad:<placeholder>``, ``input_grad:<placeholder>``.
"""
from __future__ import annotations

import difflib
import operator
from dataclasses import dataclass

import torch
from torch.fx import Node
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.frontend import costs, dims
from autoplan.frontend.dtensor_strategies import StrategyTable
from autoplan.frontend.fakes import dtype_name
from autoplan.frontend.gpu_kernels import aten_op
from autoplan.frontend.fx_meta import created_in_backward, node_attention_window, node_module, node_seq_nr
from autoplan.frontend.joint import TracedRegion
from autoplan.ir import OpGraph, OpNode, TensorInfo, TensorRef


@dataclass(frozen=True)
class RoleSource:
    """How to name dims: the same region traced at other sizes (or None) and the sizes."""

    sizes: tuple[int, int]
    alt: TracedRegion | None = None
    alt_sizes: tuple[int, int] | None = None
    experts_alt: TracedRegion | None = None     # the region rebuilt with 2x experts
    expert_count: int = 0                        # for the module heuristic when no experts_alt
    expert_modules: tuple[str, ...] = ()


def _compute_nodes(tr: TracedRegion) -> list[Node]:
    return [n for n in tr.gm.graph.nodes if not (n.op == "call_function" and n.target is operator.getitem)]


def _aligned(a: TracedRegion, b: TracedRegion | None) -> dict[Node, Node]:
    """Node of ``a`` → the same node of ``b`` (same op in a longest common op sequence).

    The graphs usually match op for op; a broadcast over a batch of 1 can make the
    other trace's backward one reduction longer, and such nodes stay unmatched.
    """
    if b is None:
        return {}
    na, nb = _compute_nodes(a), _compute_nodes(b)
    key = lambda n: (n.op, str(n.target))  # noqa: E731
    if len(na) == len(nb) and all(key(x) == key(y) for x, y in zip(na, nb)):
        return dict(zip(na, nb))
    matcher = difflib.SequenceMatcher(a=[key(n) for n in na], b=[key(n) for n in nb], autojunk=False)
    pairs = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            pairs[na[block.a + k]] = nb[block.b + k]
    return pairs


def _vals(node: Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _tensor_info(t, roles: tuple[str, ...]) -> TensorInfo | None:
    if not isinstance(t, torch.Tensor):
        return None
    return TensorInfo(tuple(int(x) for x in t.shape), dtype_name(t.dtype), roles)


def _same_output(align: dict[Node, Node], node: Node, i: int, t: torch.Tensor):
    """Output ``i`` of ``node``'s counterpart in another trace, if it has the same rank."""
    other = align.get(node)
    if other is None:
        return None
    vals = _vals(other)
    t2 = vals[i] if i < len(vals) else None
    return t2 if isinstance(t2, torch.Tensor) and t2.dim() == t.dim() else None


def _roles_for(node: Node, i: int, t: torch.Tensor, src: RoleSource, align, expert_align,
               module: str) -> tuple[str, ...]:
    shape = tuple(t.shape)
    t2 = _same_output(align, node, i, t)
    if t2 is not None:
        roles = list(dims.shape_roles(shape, tuple(t2.shape), src.sizes, src.alt_sizes))
    else:
        roles = list(dims.guessed_roles(shape, src.sizes))
    t3 = _same_output(expert_align, node, i, t)
    if t3 is not None:
        roles = [dims.EXPERT if r == dims.MODEL and a != c else r for r, a, c in zip(roles, shape, t3.shape)]
    elif not expert_align and src.expert_count and any(module == m or module.startswith(m + ".") for m in src.expert_modules):
        roles = [dims.EXPERT if r == dims.MODEL and n == src.expert_count else r
                 for r, n in zip(roles, shape)]
    return tuple(roles)


def to_opgraph(tr: TracedRegion, strategies: StrategyTable, src: RoleSource, seq_len: int,
               dtype: str, batch: int) -> tuple[OpGraph, bool]:
    """Convert one traced region; returns the graph and how many nodes' dim roles were guessed."""
    graph = tr.gm.graph
    region = tr.region
    align = _aligned(tr, src.alt)
    expert_align = _aligned(tr, src.experts_alt)

    # values: fx node (incl. getitem) → TensorRef
    ref: dict[Node, TensorRef] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            parent, idx = n.args
            ref[n] = TensorRef(ref[parent].node, idx)
        else:
            ref[n] = TensorRef(n.name, 0)
    by_name = {n.name: n for n in graph.nodes}

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    n_p, n_b, n_i = tr.n_params, tr.n_buffers, tr.n_inputs
    ph_role, ph_param = {}, {}
    for k, n in enumerate(placeholders):
        if k < n_p:
            ph_role[n], ph_param[n] = "param", region.param_names[k]
        elif k < n_p + n_b:
            ph_role[n], ph_param[n] = "buffer", region.buffer_names[k - n_p]
        elif k < n_p + n_b + n_i:
            slot = region.inputs[k - n_p - n_b]
            gets_grad = slot.requires_grad or region.name == "pre"
            ph_role[n], ph_param[n] = ("input" if gets_grad else "side_input"), ""
        else:
            ph_role[n], ph_param[n] = "tangent", ""

    output_node = next(n for n in graph.nodes if n.op == "output")
    flat = list(output_node.args[0])
    n_outs = len(region.output_slots)
    outs, grads = flat[:n_outs], flat[n_outs:]
    param_grads = {g: region.param_names[k] for k, g in enumerate(grads[:n_p]) if isinstance(g, Node)}
    input_grads = [g for g in grads[n_p:] if isinstance(g, Node)]

    def tensor_inputs(n: Node) -> list[Node]:
        return [x for x in tree_flatten((n.args, n.kwargs))[0]
                if isinstance(x, Node) and isinstance(x.meta.get("val"), torch.Tensor)]

    def producer(x: Node) -> Node:
        return by_name[ref[x].node]

    # phase: recorded in backward, or depends on a tangent
    backward: set[Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            if ph_role[n] == "tangent":
                backward.add(n)
        elif n.op == "call_function":
            if created_in_backward(n) or any(producer(x) in backward for x in tensor_inputs(n)):
                backward.add(n)

    # saved: forward storage read by backward nodes (through views)
    def storage(x: Node) -> tuple[Node, int]:
        node, idx = producer(x), ref[x].index
        while node.op == "call_function" and costs.is_view(node.target) and tensor_inputs(node):
            src_node = tensor_inputs(node)[0]
            node, idx = producer(src_node), ref[src_node].index
        return node, idx

    saved: dict[Node, set[int]] = {}
    for n in graph.nodes:
        if n in backward and n.op == "call_function":
            for x in tensor_inputs(n):
                base, idx = storage(x)
                if base not in backward:
                    saved.setdefault(base, set()).add(idx)

    # wgrad: backward nodes that are not ancestors of an input gradient
    feeds_input_grad: set[Node] = set()
    todo = [producer(g) for g in input_grads]
    while todo:
        n = todo.pop()
        if n in feeds_input_grad:
            continue
        feeds_input_grad.add(n)
        todo.extend(producer(x) for x in tensor_inputs(n))

    # modules: forward nodes carry one; backward nodes inherit through seq_nr
    module_of_seq: dict[int, str] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n not in backward and node_module(n) is not None:
            module_of_seq.setdefault(node_seq_nr(n), node_module(n))

    windows = _attention_windows(graph, backward)
    def module_of(n: Node) -> str:
        if n.op == "placeholder" and ph_role[n] in ("param", "buffer"):
            return ph_param[n].rpartition(".")[0]      # the module owning the parameter
        if n.op != "call_function":
            return ""
        m = node_module(n)
        if m is None and n in backward:
            m = module_of_seq.get(node_seq_nr(n))
        return m or ""

    guessed = sum(1 for n in _compute_nodes(tr) if n not in align)
    loss_nodes = {producer(outs[0])} if region.loss_output and outs else set()
    used = {x for n in graph.nodes for x in n.all_input_nodes}
    output_roles: tuple[str, ...] = ()
    nodes: list[OpNode] = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            continue
        if n.op == "placeholder" and n not in used and ph_role[n] != "tangent":
            continue
        module = module_of(n)
        vals = _vals(n)
        infos = tuple(None if not isinstance(t, torch.Tensor)
                      else _tensor_info(t, _roles_for(n, i, t, src, align, expert_align, module))
                      for i, t in enumerate(vals))
        phase = "backward" if n in backward else "forward"
        strategies_n = strategies.strategies.get(n.name, ())
        if n.op == "placeholder":
            nodes.append(OpNode(name=n.name, op="placeholder", inputs=(), outputs=infos, phase=phase,
                                role=ph_role[n], module=module, param=ph_param[n], saved=n in saved,
                                saved_outputs=tuple(sorted(saved.get(n, ()))),
                                strategies=strategies_n))
            continue
        if n.op == "get_attr":
            nodes.append(OpNode(name=n.name, op="constant", inputs=(), outputs=infos, phase=phase,
                                role="buffer", param=str(n.target), saved=n in saved,
                                saved_outputs=tuple(sorted(saved.get(n, ()))), strategies=strategies_n))
            continue
        if n.op == "output":
            refs, labels = _output_entries(outs, grads, placeholders, tr, ref)
            output_roles = tuple(labels)
            nodes.append(OpNode(name=n.name, op="output", inputs=tuple(refs), outputs=(),
                                phase="backward" if tr.n_tangents else "forward", role="output"))
            continue
        ins = tensor_inputs(n)
        in_vals = [x.meta["val"] for x in ins]
        view = costs.is_view(n.target)
        if n in param_grads:
            role = "param_grad"
        elif n in loss_nodes:
            role = "loss"
        else:
            role = "grad" if phase == "backward" else "activation"
        out_tensors = [t for t in vals if isinstance(t, torch.Tensor)]
        args = _arg_vals(n.args)
        window = windows.get(n, 0)
        lengths = costs.attention_lengths(n.target, args) if window else None
        fraction = costs.window_fraction(*lengths, window) if lengths else 1.0
        nodes.append(OpNode(
            name=n.name, op=str(aten_op(n.target)), inputs=tuple(ref[x] for x in ins), outputs=infos,
            phase=phase, role=role, module=module,
            flops=fraction * costs.node_flops(n.target, args, _arg_vals(n.kwargs), n.meta.get("val")),
            bytes_read=0.0 if view else float(sum(t.numel() * t.element_size() for t in in_vals)),
            bytes_written=0.0 if view else float(sum(t.numel() * t.element_size() for t in out_tensors)),
            gemm=costs.gemm_shape(n.target, args), attention_window=window,
            attention_causal=costs.attention_is_causal(n.target, args, n.kwargs),
            saved=n in saved, saved_outputs=tuple(sorted(saved.get(n, ()))),
            wgrad=phase == "backward" and n not in feeds_input_grad,
            is_view=view, param=param_grads.get(n, ""), strategies=strategies_n,
        ))
    return (OpGraph(nodes=tuple(nodes), seq_len=seq_len, dtype=dtype, output_roles=output_roles,
                    batch=batch), guessed)


def _attention_windows(graph, backward: set[Node]) -> dict[Node, int]:
    """SDPA kernel nodes of sliding-window attention → window; a backward kernel takes its
    forward's (same autograd sequence number)."""
    kernels = [n for n in graph.nodes if n.op == "call_function" and costs.is_attention_kernel(n.target)]
    of_seq = {node_seq_nr(n): node_attention_window(n) for n in kernels if n not in backward}
    windows = {n: of_seq.get(node_seq_nr(n), 0) if n in backward else node_attention_window(n) for n in kernels}
    return {n: w for n, w in windows.items() if w}


def _output_entries(outs, grads, placeholders, tr: TracedRegion, ref):
    """Output-node refs and their labels: activation | loss | param_grad:<ph> | input_grad:<ph>."""
    refs, labels = [], []
    for i, x in enumerate(outs):
        if isinstance(x, Node):
            refs.append(ref[x])
            labels.append("loss" if tr.region.loss_output and i == 0 else "activation")
    for k, g in enumerate(grads[:tr.n_params]):
        if isinstance(g, Node):
            refs.append(ref[g])
            labels.append(f"param_grad:{placeholders[k].name}")
    first_input = tr.n_params + tr.n_buffers
    for j, g in zip(tr.grad_inputs, grads[tr.n_params:]):
        if isinstance(g, Node):
            refs.append(ref[g])
            labels.append(f"input_grad:{placeholders[first_input + j].name}")
    return refs, labels


def _arg_vals(args):
    """fx args with every Node replaced by its traced value."""
    return tree_map(lambda x: x.meta.get("val") if isinstance(x, Node) else x, args)


def strategy_placeholder_names(tr: TracedRegion) -> set[str]:
    """Placeholders that may arrive as partial sums (inputs and tangents, not params/buffers)."""
    phs = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    return {n.name for n in phs[tr.n_params + tr.n_buffers:]}

