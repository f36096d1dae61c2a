"""Legal tensor-parallel strategies of every traced op, read from DTensor's own registry.

This is the only module that touches DTensor internals; each private call
sits in one small function below (``planning_mesh``, ``single_dim_rules``,
``registry_strategy``, ``placement_name``...).

Placements are spelled as DTensor prints them on a 1-D ``tp`` mesh: ``"R"``
(replicate), ``"S(d)"`` (shard tensor dim d), ``"P"`` (partial sum).  A
``Strategy`` lists the placement each tensor input must have and the
placement of each output (None for non-tensor outputs).

Enumeration (autoparallel style), in topological order:

* every graph input gets all candidate placements: R, S(d) for each dim of
  size ≥ 2, and P for activations, tangents and loss inputs (not for
  parameters and buffers);
* an op registered as a *single-dim* strategy (``op_single_dim_strategy_funcs``,
  ~1000 ops) yields its rules directly; rule placeholders become S(d) and
  the all-replicate rule is added (DTensor would only fill placeholders with
  shard types present in its inputs);
* an op registered as an *op strategy* (``op_strategy_funcs``, ~160 ops:
  views, reductions, softmax, attention, losses...) is called with each
  input's OpStrategy holding every candidate placement its producer can
  output, because many of these functions only follow the placements they
  are given.  If a call rejects the combination (e.g. a strict view of a
  sharded dim it cannot keep), inputs are tried one candidate at a time;
* the op's output candidates are the distinct output placements of its
  strategies;
* strategies are deduplicated, P(avg)/P(max)/P(min) and strided shards are
  dropped, and sharding a dim of size < 2 is dropped.  Nothing depends on
  the tp degree: the planning mesh has 2 devices, the smallest that shards,
  and the search filters by divisibility;
* ops without a registry entry (or whose entry fails) fall back to
  all-replicate, plus, for pointwise ops, "every operand sharded on the
  same output dim" (broadcast operands replicated).  ``StrategyTable.fallbacks``
  lists them.  Factories (ops without tensor inputs: ``arange``, ``full``...)
  are replicated sources and are not listed;
* every graph input also gets one strategy per candidate placement
  (``Strategy((), (placement,))``), so the search can treat it like an op.
"""
from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard
from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.frontend.gpu_kernels import aten_op
from autoplan.ir import Strategy

MESH_SIZE = 2
_MAX_COMBINATIONS = 64


# --- DTensor internals, one small function each ----------------------------------

@functools.cache
def planning_mesh() -> DeviceMesh:
    """A 1-D ``tp`` mesh of 2 CPU devices with no process group behind it."""
    return DeviceMesh("cpu", torch.arange(MESH_SIZE), mesh_dim_names=("tp",), _init_backend=False,
                      _rank=0)


def _propagator():
    return DTensor._op_dispatcher.sharding_propagator


def has_single_dim_rules(op) -> bool:
    return op in _propagator().op_single_dim_strategy_funcs


def has_registry_strategy(op) -> bool:
    return op in _propagator().op_strategy_funcs


def single_dim_rules(op, args_meta: tuple, kwargs_meta: dict) -> list[list]:
    """DTensor's single-mesh-dim rules: lists [outputs..., inputs...] of placements/placeholders."""
    info = _propagator().op_single_dim_strategy_funcs[op]
    return [list(rule) for rule in info.func(op, args_meta, kwargs_meta)]


def registry_strategy(op, args_schema: tuple, kwargs_schema: dict):
    """Call DTensor's op-strategy function on an OpSchema whose tensors are OpStrategies."""
    prop = _propagator()
    schema = OpSchema(op, args_schema, kwargs_schema, schema_info=prop.op_to_schema_info.get(op))
    return prop.op_strategy_funcs[op](schema)


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def placement(name: str):
    """``"R"`` / ``"S(d)"`` / ``"P"`` → a DTensor placement."""
    if name == "R":
        return Replicate()
    if name == "P":
        return Partial()
    return Shard(int(name[2:-1]))


def placement_name(p) -> str | None:
    """A DTensor placement as ``"R"``, ``"S(d)"`` or ``"P"``; None for those the planner skips."""
    if isinstance(p, _StridedShard):
        return None
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, _ShardingPlaceholder):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else None
    return None


def op_strategy_input(t: torch.Tensor, names: list[str]) -> OpStrategy:
    """An OpStrategy offering every placement in ``names`` for tensor ``t``."""
    meta = tensor_meta(t)
    mesh = planning_mesh()
    return OpStrategy([OpSpec(DTensorSpec(mesh, (placement(n),), tensor_meta=meta)) for n in names])


def _spec_name(spec) -> str | None:
    return None if spec is None else placement_name(spec.placements[0])


def strategies_from_registry_result(result, n_inputs: int) -> list[tuple[tuple, tuple]] | None:
    """(input names, output names) pairs from an OpStrategy / TupleStrategy result."""
    pairs = []
    if isinstance(result, OpStrategy):
        for spec in result.strategies:
            outs = spec.output_specs
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            ins: Sequence[DTensorSpec | None] | None = spec.input_specs
            ins = tuple(ins) if ins is not None else (outs[0],) * n_inputs
            pairs.append((tuple(_spec_name(s) for s in ins), tuple(_spec_name(s) for s in outs)))
        return pairs
    if isinstance(result, TupleStrategy):   # one child per output (split, unbind...)
        children = [c for c in result.children if isinstance(c, OpStrategy)]
        if not children or len({len(c.strategies) for c in children}) != 1:
            return None
        for specs in zip(*(c.strategies for c in children)):
            in_names = {tuple(_spec_name(s) for s in (sp.input_specs or ())) for sp in specs}
            if len(in_names) != 1:
                return None
            pairs.append((in_names.pop(), tuple(_spec_name(sp.output_spec) for sp in specs)))
        return pairs
    return None


# --- enumeration over a traced graph ---------------------------------------------

@dataclass
class StrategyTable:
    """Strategies per node name, the placements each value can take, and ops that fell back."""

    strategies: dict[str, tuple[Strategy, ...]] = field(default_factory=dict)
    fallbacks: set[str] = field(default_factory=set)


def candidates(t: torch.Tensor, partial: bool) -> list[str]:
    """R, S(d) for every dim of size ≥ 2, and P if ``partial`` (floating-point values only)."""
    names = ["R"] + [f"S({d})" for d, n in enumerate(t.shape) if n >= MESH_SIZE]
    return names + (["P"] if partial and t.is_floating_point() else [])


def _sort(strategies) -> tuple[Strategy, ...]:
    unique = {(s.inputs, s.outputs): s for s in strategies}
    return tuple(sorted(unique.values(),
                        key=lambda s: (sum(p not in ("R", None) for p in s.inputs + s.outputs), s.name)))


def _shardable(name: str | None, t) -> bool:
    if name is None or not name.startswith("S("):
        return True
    d = int(name[2:-1])
    return isinstance(t, torch.Tensor) and d < t.dim() and t.shape[d] >= MESH_SIZE


def _normalized(pair, in_vals, out_vals) -> tuple | None:
    """The pair with scalar outputs DTensor leaves unplaced set to R; None if not legal here."""
    ins, outs = pair
    if len(ins) != len(in_vals) or len(outs) != len(out_vals):
        return None
    for name, t in zip(ins, in_vals):
        if name is None or not _shardable(name, t):
            return None
    fixed = []
    for name, t in zip(outs, out_vals):
        if isinstance(t, torch.Tensor):
            if name is None and t.dim() == 0:
                name = "R"
            if name is None or not _shardable(name, t):
                return None
        else:
            name = None
        fixed.append(name)
    return tuple(ins), tuple(fixed)


def _out_vals(node: Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _tensor_returns(op) -> list[bool]:
    return ["Tensor" in str(r.type) for r in op._schema.returns]


def _from_single_dim(op, node: Node, in_nodes: list[Node], val_of) -> list[tuple]:
    def meta(x):
        if isinstance(x, Node):
            v = val_of(x)
            return tensor_meta(v) if isinstance(v, torch.Tensor) else v
        return x
    args_meta = tree_map(meta, node.args)
    kwargs_meta = tree_map(meta, node.kwargs)
    rules = single_dim_rules(op, args_meta, kwargs_meta)
    is_tensor = _tensor_returns(op)
    n_out = sum(is_tensor)
    # a Tensor return the op leaves undefined here (LayerNorm's bias gradient without a
    # bias) has no placement in the rules; only the outputs that exist need one
    out_vals = _out_vals(node)
    exists = [t and i < len(out_vals) and isinstance(out_vals[i], torch.Tensor) for i, t in enumerate(is_tensor)]
    pairs: list[tuple[tuple[str | None, ...], tuple[str | None, ...]]] = [
        (("R",) * len(in_nodes), tuple("R" if t else None for t in is_tensor))]
    for rule in rules:
        if len(rule) != n_out + len(in_nodes):
            continue
        outs_iter = iter(rule[:n_out])
        outs = tuple(placement_name(next(outs_iter)) if t else None for t in is_tensor)
        if any(e and o is None for e, o in zip(exists, outs)):
            continue
        pairs.append((tuple(placement_name(p) for p in rule[n_out:]), outs))
    return pairs


def _from_registry(op, node: Node, in_nodes: list[Node], cands, val_of) -> list[tuple]:
    def schema_with(choice: dict[Node, list[str]]):
        def wrap(x):
            if isinstance(x, Node):
                return op_strategy_input(val_of(x), choice[x])
            return x
        def convert(arg):
            if isinstance(arg, (list, tuple)) and arg and all(isinstance(a, Node) for a in arg):
                return TupleStrategy([wrap(a) for a in arg])
            if isinstance(arg, (list, tuple)):
                return type(arg)(wrap(a) for a in arg)
            return wrap(arg)
        return (tuple(convert(a) for a in node.args), {k: convert(v) for k, v in node.kwargs.items()})

    full = {x: cands[x] for x in in_nodes}
    try:
        args, kwargs = schema_with(full)
        pairs = strategies_from_registry_result(registry_strategy(op, args, kwargs), len(in_nodes))
        if pairs is not None:
            return pairs
    except Exception:  # noqa: BLE001 - a rejected combination; retry one candidate at a time
        pass
    combos = list(itertools.islice(itertools.product(*(cands[x] for x in dict.fromkeys(in_nodes))),
                                   _MAX_COMBINATIONS + 1))
    if len(combos) > _MAX_COMBINATIONS:
        return []
    pairs = []
    for combo in combos:
        choice = {x: [c] for x, c in zip(dict.fromkeys(in_nodes), combo)}
        try:
            args, kwargs = schema_with(choice)
            got = strategies_from_registry_result(registry_strategy(op, args, kwargs), len(in_nodes))
        except Exception:  # noqa: BLE001
            continue
        pairs.extend(got or [])
    return pairs


_UNTAGGED_POINTWISE = {torch.ops.aten.floor_divide.default, torch.ops.aten.floor_divide.Scalar}


def _fallback(op, in_vals: list, out_vals: list) -> list[tuple]:
    pairs = [(("R",) * len(in_vals), tuple("R" if isinstance(t, torch.Tensor) else None for t in out_vals))]
    out = out_vals[0] if out_vals else None
    pointwise = torch.Tag.pointwise in getattr(op, "tags", ()) or op in _UNTAGGED_POINTWISE
    if pointwise and len(out_vals) == 1 and isinstance(out, torch.Tensor):
        for d in range(out.dim()):
            if out.shape[d] < MESH_SIZE:
                continue
            ins = []
            for t in in_vals:
                k = d - (out.dim() - t.dim())
                ins.append(f"S({k})" if k >= 0 and t.shape[k] == out.shape[d] else "R")
            pairs.append((tuple(ins), (f"S({d})",)))
    return pairs


def enumerate_strategies(gm: GraphModule, partial_inputs: set[str]) -> StrategyTable:
    """Strategies of every node of ``gm``; ``partial_inputs``: placeholders that may arrive as P."""
    table = StrategyTable()
    cands: dict[Node, list[str]] = {}      # placements each tensor value can take

    def val_of(x: Node):
        return x.meta.get("val")

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            v = val_of(node)
            if isinstance(v, torch.Tensor):
                cands[node] = candidates(v, node.name in partial_inputs)
                table.strategies[node.name] = _sort(Strategy((), (c,)) for c in cands[node])
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            parent, idx = node.args
            cands[node] = table_outputs(table.strategies.get(parent.name, ()), idx, val_of(node))
            continue
        op = aten_op(node.target)
        in_nodes = [x for x in tree_flatten((node.args, node.kwargs))[0]
                    if isinstance(x, Node) and isinstance(val_of(x), torch.Tensor)]
        in_vals = [val_of(x) for x in in_nodes]
        out_vals = _out_vals(node)
        pairs: list[tuple] = []
        try:
            if has_single_dim_rules(op):
                pairs = _from_single_dim(op, node, in_nodes, val_of)
            elif has_registry_strategy(op):
                pairs = _from_registry(op, node, in_nodes, cands, val_of)
        except Exception:  # noqa: BLE001 - a registry entry that cannot handle this call
            pairs = []
        valid = [q for q in (_normalized(p, in_vals, out_vals) for p in pairs) if q is not None]
        if not valid:
            if in_nodes:   # ops without tensor inputs (factories) are sources: replicated
                table.fallbacks.add(str(op))
            valid = [q for q in (_normalized(p, in_vals, out_vals) for p in _fallback(op, in_vals, out_vals))
                     if q is not None]
        table.strategies[node.name] = _sort(Strategy(tuple(i), tuple(o)) for i, o in valid)
        if len(out_vals) == 1 and isinstance(out_vals[0], torch.Tensor):
            cands[node] = table_outputs(table.strategies[node.name], 0, out_vals[0])
    return table


def _placement_order(name: str) -> int:
    if name == "R":
        return 0
    if name == "P":
        return 1_000_000
    return 1 + int(name[2:-1])


def table_outputs(strategies: tuple[Strategy, ...], index: int, val) -> list[str]:
    """Distinct placements output ``index`` takes across ``strategies`` (R first, then S(d), P)."""
    if not isinstance(val, torch.Tensor):
        return []
    names = {s.outputs[index] for s in strategies if index < len(s.outputs) and s.outputs[index]}
    names.add("R")
    return sorted(names, key=_placement_order)  # type: ignore[arg-type]  # the filter drops None
