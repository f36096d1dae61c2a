"""Tensor and sequence parallelism from per-parameter placements on the tp axis.

A placement is ``"R"`` (replicated) or ``"S(d)"`` (sharded on tensor dim d), the
strings of ``BlockSharding.param_placements``.  ``apply`` turns every parameter of
a stage into a DTensor on the tp axis with its placement, and keeps every
activation a DTensor, so DTensor's sharding propagation computes each op on its
local shard and inserts the collectives the layouts imply.  Module boundaries pin
the layouts Megatron uses (the module *type* and the weight's placement decide,
never the module's name):

==============  ======  ========================================  ===========================
module          weight  input → output layout                     torch style it equals
==============  ======  ========================================  ===========================
nn.Linear       S(0)    input all-gathered to R, output S(-1)     ColwiseParallel
nn.Linear       S(1)    input S(-1); output reduced to R, or       RowwiseParallel
                        reduce-scattered to S(1) with sp
nn.Linear       R       as propagated                             (replicated)
nn.Embedding    S(0)    ids R; output R, or S(seq dim) with sp    RowwiseParallel, vocab-parallel
experts         S(0)    as propagated: each tp rank runs E/tp     (experts over tp)
                        experts on the replicated token buffer
other           any     as propagated: a norm on the sp residual  SequenceParallel
                        stream runs on its sequence shard
==============  ======  ========================================  ===========================

With sp the residual stream between blocks is S(1) (sequence) on tp, else R, and a
column-parallel linear whose input arrives sequence-sharded runs as Megatron-Core's
``LinearWithGradAccumulationAndAsyncCommunication`` does under sequence parallelism
(``_SequenceGatherLinear``): it all-gathers the shard for the matmul but saves the *shard*,
gathering again in backward, which reduce-scatters the input gradient.  DTensor's own
redistribution would save the gathered, full-sequence input once per linear that reads it (wq,
wk, wv, w1, w3: 5·s·h·2 bytes per layer, not divided by tp), which is not what Megatron keeps.  Logits
of a vocabulary-parallel head stay split over tp and the default loss is computed on the
shards (``parallel.vocab_parallel_cross_entropy``, DTensor's ``loss_parallel``); other
logits, or a custom loss, are gathered to R first.

Why not ``parallelize_module`` with those styles: they return local tensors between
modules (so a model's own ``view(b, s, heads, d)`` sees the local head count), and
they re-layout an input DTensor only when their *configured* input layout differs
from the desired one.  Keeping DTensors everywhere makes every placement assignment
the ILP may produce compute the single-device result; the module boundaries above
only pin where Megatron's collectives happen.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor

from autoplan.apply.expert_parallel import expert_count
from autoplan.apply.layout import COLWISE, EMBEDDING, ROWWISE, ModelLayout
from autoplan.errors import UserError

PlacementsArg = Mapping[str, str] | Callable[[int, nn.Module], Mapping[str, str]] | None
_PLACEMENT = re.compile(r"^(R|S\((-?\d+)\))$")


def parse_placement(text: str, shape: torch.Size, tp: int, name: str) -> Placement:
    """``"R"`` → Replicate(), ``"S(d)"`` → Shard(d); the sharded dim must divide by tp."""
    m = _PLACEMENT.match(text.strip())
    if not m:
        raise UserError(f"placement {text!r} of parameter {name} is not R or S(d)",
                        "give tp placements as 'R', 'S(0)', 'S(1)', ...")
    if m.group(2) is None:
        return Replicate()
    dim = int(m.group(2))
    dim = dim + len(shape) if dim < 0 else dim
    if not 0 <= dim < len(shape):
        raise UserError(f"placement {text} of parameter {name} names dim {dim}, the parameter has "
                        f"{len(shape)} dims", "use a dim of the parameter")
    if shape[dim] % tp:
        raise UserError(f"placement {text} of parameter {name}: dim {dim} of size {shape[dim]} "
                        f"does not divide by tp={tp}", "replicate it (R) or shard another dim")
    return Shard(dim)


def default_placement(layout: ModelLayout, module_name: str, module: nn.Module, param: str,
                      tensor: torch.Tensor, tp: int, ep: int = 1) -> str:
    """Megatron's rule for one parameter (see layout.py), falling back to R when tp does not divide
    (an experts module's E/ep local experts, under expert parallelism ``ep``)."""
    fqn = f"{module_name}.{param}" if module_name else param
    if fqn in layout.head_weights and tensor.dim() == 2:
        return "S(0)" if tensor.shape[0] % tp == 0 else "R"
    role = layout.roles.get(module_name)
    if role == COLWISE and isinstance(module, nn.Linear):
        return "S(0)" if module.out_features % tp == 0 else "R"
    if role == ROWWISE and isinstance(module, nn.Linear):
        if param == "weight" and module.in_features % tp == 0:
            return "S(1)"
        return "R"
    if role == EMBEDDING and param == "weight":
        rows, cols = tensor.shape
        return "S(0)" if rows % tp == 0 else ("S(1)" if cols % tp == 0 else "R")
    if tensor.dim() >= 3 and layout.block_of(module_name) is not None and (experts := expert_count(module)):
        return "S(0)" if experts % ep == 0 and (experts // ep) % tp == 0 else "R"
    return "R"


def resolve_placements(model: nn.Module, layout: ModelLayout, tp: int,
                       placements: PlacementsArg, ep: int = 1) -> dict[str, str]:
    """Placement of every parameter (model FQN → "R" | "S(d)").

    ``placements`` maps parameter names *within a block* (``attn.q_proj.weight``)
    to placements and applies to every block that has those names; it may also name
    parameters outside the blocks by their full name (``wte.weight``).  It may be a
    callable ``(block_index, block) -> mapping`` instead.  A given mapping must cover
    every parameter of every block, except that a missing ``X.bias`` follows its
    ``X.weight`` (``S(0)`` if the weight is ``S(0)``, else ``R``); parameters outside
    the blocks default to Megatron's rule.  ``None``: Megatron's rule everywhere.  ``ep``: the
    expert-parallel degree (tp must divide the E/ep experts a rank keeps to shard them).
    """
    modules = dict(model.named_modules())
    blocks = modules[layout.blocks_path]
    out: dict[str, str] = {}
    for mod_name, module in modules.items():
        for pname, tensor in module.named_parameters(recurse=False):
            fqn = f"{mod_name}.{pname}" if mod_name else pname
            out[fqn] = default_placement(layout, mod_name, module, pname, tensor, tp, ep)
    if placements is None:
        return out
    for i, block in enumerate(blocks):
        given = placements(i, block) if callable(placements) else placements
        prefix = layout.block_prefix(i)
        given = _with_biases(given, layout.block_params[i])
        missing = [n for n in layout.block_params[i] if n not in given]
        if missing:
            raise UserError(f"placements do not cover block {i}: missing {', '.join(missing[:6])}"
                            + (" ..." if len(missing) > 6 else ""),
                            "give a placement (R or S(d)) for every parameter of the block")
        for n in layout.block_params[i]:
            out[prefix + n] = given[n]
    if not callable(placements):
        for name, value in placements.items():
            if name in out and layout.block_of(name) is None:
                out[name] = value
    return out


def check_placements(model: nn.Module, layout: ModelLayout, tp: int, placements: PlacementsArg) -> dict[str, str]:
    """``resolve_placements`` plus the shape checks of every placement (works on a meta model)."""
    resolved = resolve_placements(model, layout, tp, placements)
    for name, p in model.named_parameters():
        parse_placement(resolved[name], p.shape, tp, name)
    return resolved


def check_placements_on_meta(build: Callable[[], nn.Module], tp: int, mbs: int,
                             placements: PlacementsArg) -> dict[str, str]:
    """``check_placements`` on a model built and probed on the meta device (no memory, no
    weights, ``layout.probe_on_meta``): what ``autoplan run`` checks once before it starts any process."""
    from autoplan.apply.layout import probe_on_meta

    model, layout = probe_on_meta(build, mbs)
    return check_placements(model, layout, tp, placements)


def _with_biases(given: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    out = dict(given)
    for n in names:
        owner, _, leaf = n.rpartition(".")
        weight = f"{owner}.weight" if owner else "weight"
        if leaf == "bias" and n not in out and weight in out:
            out[n] = "S(0)" if out[weight].strip() == "S(0)" else "R"
    return out


def _to_dtensor(x, mesh: DeviceMesh, placements: tuple[Placement, ...]):
    """A plain tensor is a replicated activation; a DTensor is moved to ``placements``."""
    if not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
    if tuple(x.placements) != tuple(placements):
        x = x.redistribute(mesh, placements)
    return x


def _io_layouts(module: nn.Module, name: str, weight: Placement | None, layout: ModelLayout,
                sp: bool) -> tuple[tuple[Placement, ...] | None, tuple[Placement, ...] | None]:
    """(input, output) layouts pinned at the module boundary; None: as propagated."""
    if isinstance(module, nn.Linear):
        if isinstance(weight, Shard) and weight.dim == 0:
            return (Replicate(),), None
        if isinstance(weight, Shard) and weight.dim == 1:
            out = Shard(1) if sp and name in layout.stream_shaped else Replicate()
            return (Shard(-1),), (out,)
        return None, None
    if isinstance(module, nn.Embedding):
        seq_dim = layout.index_ndim.get(name, 2) - 1
        return (Replicate(),), ((Shard(seq_dim),) if sp else (Replicate(),))
    if sp and _feeds_head(module, name, layout):
        return None, (Replicate(),)
    return None, None


def _feeds_head(module: nn.Module, name: str, layout: ModelLayout) -> bool:
    """The module after the blocks that hands the residual stream to the head: the final norm
    (stream-shaped, all its parameters read after the blocks).  Under sp its output is
    all-gathered to R there, as Megatron's output layer gathers its input, so that the head is
    column-parallel in both passes.  Left to propagation (a head the model calls as
    ``F.linear(x, weight)`` has no module to pin), DTensor prices the head's weight gradient
    ``dyᵀ·x`` (dy split over the vocabulary, x over the sequence) cheapest as a partial sum over
    the sequence at full size: a whole ``[V, h]`` gradient on every tp rank, reduce-scattered
    later (under the pipeline's no-sync, an fp32 V·h accumulator: 8 GiB at llama3-405b, tp=8)."""
    prefix = f"{name}." if name else ""
    own = [prefix + p for p, _ in module.named_parameters(recurse=False)]
    return bool(layout.head_weights) and name in layout.stream_shaped and bool(own) and all(
        p in layout.post and p not in layout.head_weights for p in own)


def shard_module_tree(model: nn.Module, layout: ModelLayout, placements: dict[str, str],
                      tp_mesh: DeviceMesh, sp: bool, skip: frozenset[str] = frozenset()) -> None:
    """Make every parameter of ``model`` a DTensor on ``tp_mesh`` and pin module layouts.

    Parameters that are not ``nn.Parameter`` any more (stubs of a pipeline stage that
    does not own them) are left alone, and so are the modules named in ``skip`` (a folded plan's
    experts under etp = 1: not on tp), which must have no ancestor with parameters of its own
    (distribute_module would replicate theirs).
    """
    tp = tp_mesh.size()
    # children first: distribute_module replicates every plain parameter below the module
    for name, module in reversed(list(model.named_modules())):
        own = dict(module.named_parameters(recurse=False))
        if not own or name in skip:
            continue
        if any(s.startswith(f"{name}.") or not name for s in skip):
            raise UserError(f"{type(module).__name__} {name!r} has parameters of its own above the experts "
                            f"modules {sorted(skip)}, which tensor parallelism would replicate over tp",
                            "run the plan with etp equal to tp, or unfolded (omit etp)")
        prefix = f"{name}." if name else ""
        chosen = {p: parse_placement(placements[prefix + p], t.shape, tp, prefix + p) for p, t in own.items()}

        def partition(sub_name, sub, mesh, chosen=chosen, module=module):
            if sub is not module:
                return
            for p, placement in chosen.items():
                param = getattr(sub, p)
                sub.register_parameter(p, nn.Parameter(distribute_tensor(param.data, mesh, [placement]),
                                                       requires_grad=param.requires_grad))

        layouts = _io_layouts(module, name, chosen.get("weight"), layout, sp)
        output_fn = _embedding_output_fn if isinstance(module, nn.Embedding) else _output_fn
        colwise_sp = sp and type(module) is nn.Linear and layouts[0] == (Replicate(),)
        vocab = _vocab_parallel(module, chosen.get("weight"))
        input_fn = _input_fn(layouts[0])
        if input_fn is None and isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
            input_fn = _whole_normalized_dims(len(module.normalized_shape))
        distribute_module(module, tp_mesh, partition, None if colwise_sp or vocab else input_fn,
                          None if vocab else output_fn(layouts[1]))
        if colwise_sp:          # a class swap, not a bound forward: stage deep copies keep it
            module.__class__ = SequenceParallelColwiseLinear
            module.tp_mesh = tp_mesh
        if vocab:
            module.__class__ = VocabParallelEmbedding
            module.tp_mesh, module.out_placements = tp_mesh, layouts[1]


class _SequenceGatherLinear(torch.autograd.Function):
    """``y = all_gather(x_shard) @ wᵀ + b`` on local tensors, saving ``x_shard`` (module docstring).

    Backward: ``x = all_gather(x_shard)`` again; ``dW = dyᵀ·x``, ``db = Σ dy``; ``dx_shard =
    reduce_scatter(dy·W)`` over tp (each rank's output columns contribute to every input)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dim: int, mesh: DeviceMesh):
        ctx.save_for_backward(x, weight)
        ctx.dim, ctx.mesh, ctx.has_bias = dim, mesh, bias is not None
        return nn.functional.linear(_gather(x, dim, mesh), weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        full = _gather(x, ctx.dim, ctx.mesh)
        flat = dy.reshape(-1, dy.shape[-1])
        dw = flat.t() @ full.reshape(-1, full.shape[-1])
        db = flat.sum(0) if ctx.has_bias else None
        dx = funcol.wait_tensor(funcol.reduce_scatter_single((dy @ weight).contiguous(), "sum", ctx.dim, ctx.mesh))
        return dx, dw, db, None, None


def _gather(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), dim, mesh))


class SequenceParallelColwiseLinear(nn.Linear):
    """A column-parallel ``nn.Linear`` (weight S(0)) under sp: a sequence-sharded input runs
    through ``_SequenceGatherLinear``; any other input is brought to R first (as before)."""

    tp_mesh: DeviceMesh

    def forward(self, x):
        shard = x.placements[0] if isinstance(x, DTensor) and len(x.placements) == 1 else None
        if not (isinstance(shard, Shard) and shard.dim % x.ndim != x.ndim - 1
                and x.shape[shard.dim] % self.tp_mesh.size() == 0):
            return super().forward(_to_dtensor(x, self.tp_mesh, (Replicate(),)))
        bias = None if self.bias is None else self.bias.to_local()
        out = _SequenceGatherLinear.apply(x.to_local(), self.weight.to_local(), bias, shard.dim % x.ndim,
                                          self.tp_mesh)
        return DTensor.from_local(out, self.tp_mesh, (Shard(out.ndim - 1),), run_check=False)


def _vocab_parallel(module: nn.Module, weight: Placement | None) -> bool:
    """A plain ``nn.Embedding`` whose table is split over the vocabulary (S(0))."""
    return (type(module) is nn.Embedding and isinstance(weight, Shard) and weight.dim == 0
            and module.padding_idx is None and module.max_norm is None and not module.sparse)


class _VocabParallelLookup(torch.autograd.Function):
    """Megatron-Core's ``VocabParallelEmbedding`` on local tensors: rows of this rank's vocabulary
    shard ``[start, start + n)`` looked up, the others zero, the partial sums reduced over tp
    (all-reduce to R, or reduce-scatter over the sequence dim ``seq_dim`` under sp).

    Backward: the output gradient (all-gathered over the sequence under sp) of the ids this rank
    holds, accumulated into its own ``[n, h]`` rows (``embedding_dense_backward``).  DTensor's
    embedding backward has no vocabulary-sharded strategy: it computes the whole ``[V, h]``
    gradient as a partial sum on every tp rank and reduce-scatters it, which under the pipeline's
    no-sync keeps a V·h fp32 accumulator on the first stage (8 GiB at llama3-405b, tp=8)."""

    @staticmethod
    def forward(ctx, ids, weight, start: int, seq_dim: int | None, mesh: DeviceMesh):
        n = weight.shape[0]
        outside = (ids < start) | (ids >= start + n)
        local = (ids - start).masked_fill(outside, 0)
        ctx.save_for_backward(local, outside)
        ctx.n, ctx.seq_dim, ctx.mesh = n, seq_dim, mesh
        out = nn.functional.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if seq_dim is None:
            return funcol.wait_tensor(funcol.all_reduce(out, "sum", mesh))
        return funcol.wait_tensor(funcol.reduce_scatter_single(out.contiguous(), "sum", seq_dim, mesh))

    @staticmethod
    def backward(ctx, dy):
        local, outside = ctx.saved_tensors
        if ctx.seq_dim is not None:
            dy = _gather(dy, ctx.seq_dim, ctx.mesh)
        dy = dy.masked_fill(outside.unsqueeze(-1), 0.0)
        dw = torch.ops.aten.embedding_dense_backward(dy, local, ctx.n, -1, False)
        return None, dw, None, None, None


class VocabParallelEmbedding(nn.Embedding):
    """A vocabulary-parallel ``nn.Embedding`` (weight S(0)) run as ``_VocabParallelLookup``;
    the output a DTensor in ``out_placements`` (R, or S(seq dim) under sp)."""

    tp_mesh: DeviceMesh
    out_placements: tuple[Placement, ...]

    def forward(self, ids):
        ids = ids.to_local() if isinstance(ids, DTensor) else ids
        weight = self.weight.to_local()
        start = self.tp_mesh.get_local_rank() * weight.shape[0]
        seq_dim = self.out_placements[0].dim if isinstance(self.out_placements[0], Shard) else None
        out = _VocabParallelLookup.apply(ids, weight, start, seq_dim, self.tp_mesh)
        return DTensor.from_local(out, self.tp_mesh, self.out_placements, run_check=False)


def _input_fn(placements):
    if placements is None:
        return None

    def fn(module, inputs, mesh):
        return (_to_dtensor(inputs[0], mesh, placements),) + tuple(inputs[1:])
    return fn


def _whole_normalized_dims(normalized: int):
    """A norm's input with its ``normalized`` last dims whole: their shards gathered and partial sums
    reduced, other placements kept (sp's sequence shard).  A norm on the residual stream never needs
    it; MLA's latent norms do, after a down-projection the layout splits (column-parallel: the
    latent dim sharded; row-parallel: a partial sum), as the block ILP prices them."""
    def fn(module, inputs, mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            return inputs
        whole = tuple(Replicate() if p.is_partial() or (isinstance(p, Shard) and p.dim % x.ndim >= x.ndim - normalized)
                      else p for p in x.placements)
        return inputs if whole == tuple(x.placements) else (x.redistribute(x.device_mesh, whole),) + tuple(inputs[1:])
    return fn


def _embedding_output_fn(placements):
    """Like ``_output_fn``, and the gradient arriving at the embedding's output is brought to
    that layout first: a vocab-parallel embedding's output is a masked partial sum, and DTensor
    cannot turn a plain partial-sum gradient (what the residual stream carries back without
    sp) into a masked one; reduced to the output's layout, it can."""
    if placements is None:
        return None

    def fn(module, output, mesh):
        x = _to_dtensor(output, mesh, placements)
        # from_local's backward redistributes the incoming gradient to ``placements``
        return DTensor.from_local(x.to_local(), mesh, placements, run_check=False)
    return fn


def _output_fn(placements):
    if placements is None:
        return None

    def fn(module, output, mesh):
        return _to_dtensor(output, mesh, placements)
    return fn
