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
from torch.fx import Graph, Node
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.frontend import costs, dims
from autoplan.frontend.dtensor_strategies import StrategyTable
from autoplan.frontend.fakes import dtype_name
from autoplan.frontend.fx_meta import created_in_backward, node_attention_window, node_module, node_seq_nr
from autoplan.frontend.gpu_kernels import aten_op
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
    return [n for n in tr.gm.graph.nodes if not _is_getitem(n)]


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
        roles = list(dims.shape_roles(shape, tuple(t2.shape), src.sizes, src.alt_sizes))  # type: ignore[arg-type]  # t2: alt set
    else:
        roles = list(dims.guessed_roles(shape, src.sizes))
    t3 = _same_output(expert_align, node, i, t)
    if t3 is not None:
        roles = [dims.EXPERT if r == dims.MODEL and a != c else r for r, a, c in zip(roles, shape, t3.shape)]
    elif not expert_align and src.expert_count and any(module == m or module.startswith(m + ".")
                                                         for m in src.expert_modules):
        roles = [dims.EXPERT if r == dims.MODEL and n == src.expert_count else r
                 for r, n in zip(roles, shape)]
    return tuple(roles)


@dataclass(frozen=True)
class ConvertedRegion:
    """One region's ``OpGraph`` and how many of its nodes had their dim roles guessed from
    sizes alone (no counterpart in the second trace), which the caller notes for the user."""

    graph: OpGraph
    guessed_nodes: int


def to_opgraph(tr: TracedRegion, strategies: StrategyTable, src: RoleSource, seq_len: int,
               dtype: str, batch: int) -> ConvertedRegion:
    """Convert one traced region: the passes over its graph first (``_region_facts``), then
    one ``OpNode`` per kept fx node, in graph order."""
    facts = _region_facts(tr, src)
    nodes = tuple(_op_node(n, facts, strategies.strategies.get(n.name, ()))
                  for n in tr.gm.graph.nodes if _kept(n, facts))
    graph = OpGraph(nodes=nodes, seq_len=seq_len, dtype=dtype, output_roles=facts.entries.labels,
                    batch=batch)
    return ConvertedRegion(graph=graph, guessed_nodes=sum(1 for n in _compute_nodes(tr) if n not in facts.align))


@dataclass(frozen=True)
class _Values:
    """Where each fx value lives: ``ref`` maps every node (``getitem`` included) to the
    ``TensorRef`` the IR uses for it, ``by_name`` maps an op's name back to its node."""

    ref: dict[Node, TensorRef]
    by_name: dict[str, Node]

    def producer(self, x: Node) -> Node:
        """The op computing ``x`` (for a ``getitem``, the multi-output op behind it)."""
        return self.by_name[self.ref[x].node]

    def storage(self, x: Node) -> tuple[Node, int]:
        """The op and output index owning ``x``'s storage, followed back through views."""
        node, idx = self.producer(x), self.ref[x].index
        while node.op == "call_function" and costs.is_view(node.target) and _tensor_inputs(node):
            src_node = _tensor_inputs(node)[0]
            node, idx = self.producer(src_node), self.ref[src_node].index
        return node, idx


@dataclass(frozen=True)
class _Placeholders:
    """The placeholders in graph order, each one's role (param | buffer | input | side_input |
    tangent) and, for parameters and buffers, its name relative to the region's root module."""

    nodes: list[Node]
    role: dict[Node, str]
    param: dict[Node, str]


@dataclass(frozen=True)
class _Outputs:
    """The output node's entries: region outputs, then gradients (parameters first, then inputs;
    None where there is none), with the gradient nodes picked out."""

    outs: list
    grads: list
    param_grads: dict[Node, str]          # parameter-gradient node → parameter name
    input_grads: list[Node]


@dataclass(frozen=True)
class _OutputEntries:
    """The output node's inputs (None entries omitted) and their ``OpGraph.output_roles`` labels."""

    refs: tuple[TensorRef, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class _RegionFacts:
    """What the passes over one traced region found; every emitted ``OpNode`` reads it."""

    tr: TracedRegion
    src: RoleSource
    align: dict[Node, Node]               # node → its counterpart in the trace at other sizes
    expert_align: dict[Node, Node]        # node → its counterpart in the 2x-experts trace
    values: _Values
    placeholders: _Placeholders
    outputs: _Outputs
    entries: _OutputEntries
    backward: set[Node]
    saved: dict[Node, set[int]]           # storage owner → its outputs read by backward nodes
    feeds_input_grad: set[Node]
    module_of_seq: dict[int | None, str | None]   # autograd sequence number → module of its forward op
    windows: dict[Node, int]              # sliding-window SDPA kernels → window
    loss_nodes: set[Node]
    used: set[Node]                       # nodes some node reads


def _region_facts(tr: TracedRegion, src: RoleSource) -> _RegionFacts:
    """Run the passes over ``tr``'s graph, each a function of the ones before it."""
    graph = tr.gm.graph
    values = _values(graph)
    placeholders = _placeholders(tr)
    outputs = _outputs(tr)
    backward = _backward_nodes(graph, placeholders, values)
    loss_nodes = {values.producer(outputs.outs[0])} if tr.region.loss_output and outputs.outs else set()
    return _RegionFacts(
        tr=tr, src=src, align=_aligned(tr, src.alt), expert_align=_aligned(tr, src.experts_alt),
        values=values, placeholders=placeholders, outputs=outputs,
        entries=_output_entries(outputs, placeholders.nodes, tr, values.ref),
        backward=backward, saved=_saved_storages(graph, backward, values),
        feeds_input_grad=_input_grad_ancestors(outputs, values),
        module_of_seq=_module_of_seq(graph, backward), windows=_attention_windows(graph, backward),
        loss_nodes=loss_nodes, used={x for n in graph.nodes for x in n.all_input_nodes})


def _is_getitem(n: Node) -> bool:
    return n.op == "call_function" and n.target is operator.getitem


def _tensor_inputs(n: Node) -> list[Node]:
    """The nodes ``n`` reads whose value is a tensor, in argument order."""
    return [x for x in tree_flatten((n.args, n.kwargs))[0]
            if isinstance(x, Node) and isinstance(x.meta.get("val"), torch.Tensor)]


def _values(graph: Graph) -> _Values:
    """Every fx value as a ``TensorRef``: a ``getitem`` becomes output i of its parent op."""
    ref: dict[Node, TensorRef] = {}
    for n in graph.nodes:
        if _is_getitem(n):
            parent, idx = n.args
            ref[n] = TensorRef(ref[parent].node, idx)
        else:
            ref[n] = TensorRef(n.name, 0)
    return _Values(ref=ref, by_name={n.name: n for n in graph.nodes})


def _placeholders(tr: TracedRegion) -> _Placeholders:
    """Role and parameter name of each placeholder, from its position (see Conventions)."""
    region = tr.region
    nodes = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    n_p, n_b, n_i = tr.n_params, tr.n_buffers, tr.n_inputs
    role: dict[Node, str] = {}
    param: dict[Node, str] = {}
    for k, n in enumerate(nodes):
        if k < n_p:
            role[n], param[n] = "param", region.param_names[k]
        elif k < n_p + n_b:
            role[n], param[n] = "buffer", region.buffer_names[k - n_p]
        elif k < n_p + n_b + n_i:
            slot = region.inputs[k - n_p - n_b]
            gets_grad = slot.requires_grad or region.name == "pre"
            role[n], param[n] = ("input" if gets_grad else "side_input"), ""
        else:
            role[n], param[n] = "tangent", ""
    return _Placeholders(nodes=nodes, role=role, param=param)


def _outputs(tr: TracedRegion) -> _Outputs:
    """Split the output node's entries into region outputs and parameter / input gradients."""
    output_node = next(n for n in tr.gm.graph.nodes if n.op == "output")
    flat = list(output_node.args[0])
    n_outs = len(tr.region.output_slots)
    outs, grads = flat[:n_outs], flat[n_outs:]
    param_grads = {g: tr.region.param_names[k] for k, g in enumerate(grads[:tr.n_params]) if isinstance(g, Node)}
    input_grads = [g for g in grads[tr.n_params:] if isinstance(g, Node)]
    return _Outputs(outs=outs, grads=grads, param_grads=param_grads, input_grads=input_grads)


def _backward_nodes(graph: Graph, placeholders: _Placeholders, values: _Values) -> set[Node]:
    """Tangents, and ops recorded while autograd ran a backward function or that depend on a
    tangent."""
    backward: set[Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            if placeholders.role[n] == "tangent":
                backward.add(n)
        elif n.op == "call_function" and (created_in_backward(n)
                                          or any(values.producer(x) in backward for x in _tensor_inputs(n))):
            backward.add(n)
    return backward


def _saved_storages(graph: Graph, backward: set[Node], values: _Values) -> dict[Node, set[int]]:
    """Forward storage read by backward ops (through views): owner → its output indices."""
    saved: dict[Node, set[int]] = {}
    for n in graph.nodes:
        if n in backward and n.op == "call_function":
            for x in _tensor_inputs(n):
                base, idx = values.storage(x)
                if base not in backward:
                    saved.setdefault(base, set()).add(idx)
    return saved


def _input_grad_ancestors(outputs: _Outputs, values: _Values) -> set[Node]:
    """The ops some input gradient depends on; backward ops outside this set are ``wgrad``."""
    feeds_input_grad: set[Node] = set()
    todo = [values.producer(g) for g in outputs.input_grads]
    while todo:
        n = todo.pop()
        if n in feeds_input_grad:
            continue
        feeds_input_grad.add(n)
        todo.extend(values.producer(x) for x in _tensor_inputs(n))
    return feeds_input_grad


def _module_of_seq(graph: Graph, backward: set[Node]) -> dict[int | None, str | None]:
    """Autograd sequence number → module of the first forward op carrying it: backward ops
    inherit their module through it."""
    module_of_seq: dict[int | None, str | None] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n not in backward and node_module(n) is not None:
            module_of_seq.setdefault(node_seq_nr(n), node_module(n))
    return module_of_seq


def _kept(n: Node, facts: _RegionFacts) -> bool:
    """False for ``getitem`` nodes and for placeholders no op reads (tangents are always kept)."""
    if _is_getitem(n):
        return False
    return not (n.op == "placeholder" and n not in facts.used and facts.placeholders.role[n] != "tangent")


def _op_node(n: Node, facts: _RegionFacts, strategies: tuple) -> OpNode:
    """The ``OpNode`` of one kept fx node."""
    if n.op == "placeholder":
        return _placeholder_node(n, facts, strategies)
    if n.op == "get_attr":
        return _constant_node(n, facts, strategies)
    if n.op == "output":
        return OpNode(name=n.name, op="output", inputs=facts.entries.refs, outputs=(),
                      phase="backward" if facts.tr.n_tangents else "forward", role="output")
    return _compute_node(n, facts, strategies)


def _module_of(n: Node, facts: _RegionFacts) -> str:
    """A parameter's or buffer's owning module; an op's module (a backward op's through its
    sequence number); "" for anything else."""
    if n.op == "placeholder" and facts.placeholders.role[n] in ("param", "buffer"):
        return facts.placeholders.param[n].rpartition(".")[0]
    if n.op != "call_function":
        return ""
    m = node_module(n)
    if m is None and n in facts.backward:
        m = facts.module_of_seq.get(node_seq_nr(n))
    return m or ""


def _phase(n: Node, facts: _RegionFacts) -> str:
    return "backward" if n in facts.backward else "forward"


def _output_infos(n: Node, facts: _RegionFacts, module: str) -> tuple[TensorInfo | None, ...]:
    """Shape, dtype and dim roles of each of ``n``'s outputs (None where not a tensor)."""
    return tuple(None if not isinstance(t, torch.Tensor)
                 else _tensor_info(t, _roles_for(n, i, t, facts.src, facts.align, facts.expert_align, module))
                 for i, t in enumerate(_vals(n)))


def _saved_outputs(n: Node, facts: _RegionFacts) -> tuple[int, ...]:
    return tuple(sorted(facts.saved.get(n, ())))


def _placeholder_node(n: Node, facts: _RegionFacts, strategies: tuple) -> OpNode:
    module = _module_of(n, facts)
    return OpNode(name=n.name, op="placeholder", inputs=(), outputs=_output_infos(n, facts, module),
                  phase=_phase(n, facts), role=facts.placeholders.role[n], module=module,
                  param=facts.placeholders.param[n], saved=n in facts.saved,
                  saved_outputs=_saved_outputs(n, facts), strategies=strategies)


def _constant_node(n: Node, facts: _RegionFacts, strategies: tuple) -> OpNode:
    """A ``get_attr`` constant: a buffer named by its attribute, owned by no module."""
    return OpNode(name=n.name, op="constant", inputs=(), outputs=_output_infos(n, facts, ""),
                  phase=_phase(n, facts), role="buffer", param=str(n.target), saved=n in facts.saved,
                  saved_outputs=_saved_outputs(n, facts), strategies=strategies)


def _compute_node(n: Node, facts: _RegionFacts, strategies: tuple) -> OpNode:
    """An ATen op: its costs (none moved for a view), role, and saved / wgrad marks."""
    phase = _phase(n, facts)
    module = _module_of(n, facts)
    ins = _tensor_inputs(n)
    view = costs.is_view(n.target)
    args = _arg_vals(n.args)
    window = facts.windows.get(n, 0)
    return OpNode(
        name=n.name, op=str(aten_op(n.target)), inputs=tuple(facts.values.ref[x] for x in ins),
        outputs=_output_infos(n, facts, module), phase=phase, role=_compute_role(n, phase, facts),
        module=module, flops=_flops(n, args, window),
        bytes_read=0.0 if view else _bytes([x.meta["val"] for x in ins]),
        bytes_written=0.0 if view else _bytes([t for t in _vals(n) if isinstance(t, torch.Tensor)]),
        gemm=costs.gemm_shape(n.target, args), attention_window=window,
        attention_causal=costs.attention_is_causal(n.target, args, n.kwargs),
        saved=n in facts.saved, saved_outputs=_saved_outputs(n, facts),
        wgrad=phase == "backward" and n not in facts.feeds_input_grad,
        is_view=view, param=facts.outputs.param_grads.get(n, ""), strategies=strategies,
    )


def _compute_role(n: Node, phase: str, facts: _RegionFacts) -> str:
    if n in facts.outputs.param_grads:
        return "param_grad"
    if n in facts.loss_nodes:
        return "loss"
    return "grad" if phase == "backward" else "activation"


def _flops(n: Node, args: tuple, window: int) -> float:
    """The op's FLOPs; a sliding-window SDPA kernel counts only the band."""
    lengths = costs.attention_lengths(n.target, args) if window else None
    fraction = costs.window_fraction(*lengths, window) if lengths else 1.0
    return fraction * costs.node_flops(n.target, args, _arg_vals(n.kwargs), n.meta.get("val"))


def _bytes(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _attention_windows(graph: Graph, backward: set[Node]) -> dict[Node, int]:
    """SDPA kernel nodes of sliding-window attention → window; a backward kernel takes its
    forward's (same autograd sequence number)."""
    kernels = [n for n in graph.nodes if n.op == "call_function" and costs.is_attention_kernel(n.target)]
    of_seq = {node_seq_nr(n): node_attention_window(n) for n in kernels if n not in backward}
    windows = {n: of_seq.get(node_seq_nr(n), 0) if n in backward else node_attention_window(n) for n in kernels}
    return {n: w for n, w in windows.items() if w}


def _output_entries(outputs: _Outputs, placeholders: list[Node], tr: TracedRegion,
                    ref: dict[Node, TensorRef]) -> _OutputEntries:
    """Output-node refs and their labels: activation | loss | param_grad:<ph> | input_grad:<ph>."""
    refs, labels = [], []
    for i, x in enumerate(outputs.outs):
        if isinstance(x, Node):
            refs.append(ref[x])
            labels.append("loss" if tr.region.loss_output and i == 0 else "activation")
    for k, g in enumerate(outputs.grads[:tr.n_params]):
        if isinstance(g, Node):
            refs.append(ref[g])
            labels.append(f"param_grad:{placeholders[k].name}")
    first_input = tr.n_params + tr.n_buffers
    for j, g in zip(tr.grad_inputs, outputs.grads[tr.n_params:]):
        if isinstance(g, Node):
            refs.append(ref[g])
            labels.append(f"input_grad:{placeholders[first_input + j].name}")
    return _OutputEntries(refs=tuple(refs), labels=tuple(labels))


def _arg_vals(args):
    """fx args with every Node replaced by its traced value."""
    return tree_map(lambda x: x.meta.get("val") if isinstance(x, Node) else x, args)


def strategy_placeholder_names(tr: TracedRegion) -> set[str]:
    """Placeholders that may arrive as partial sums (inputs and tangents, not params/buffers)."""
    phs = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    return {n.name for n in phs[tr.n_params + tr.n_buffers:]}

