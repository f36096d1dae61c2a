"""The loss kernel: what a fused softmax-cross-entropy keeps and costs in place of the traced loss.

``EstimateOptions.loss_kernel`` names what computes the LM loss:

* ``eager`` (the default): what the trace records, ``F.cross_entropy`` on the fp32 logits: a cast
  of the bf16 logits to fp32, ``_log_softmax`` (its fp32 output saved, 4 bytes per logit) and
  ``nll_loss_forward``; in backward their mirrors, ``nll_loss_backward``,
  ``_log_softmax_backward_data`` and the cast back to bf16, whose fp32 buffers are
  ``memory.LOSS_GRAD_BYTES``.
* ``fused``: one softmax-cross-entropy kernel on the logits as the head writes them (bf16):
  flash-attn's ``CrossEntropyLoss`` (``flash_attn/losses/cross_entropy.py``,
  ``SoftmaxCrossEntropyLossFn`` over ``xentropy_cuda_lib``, flash-attn 1.0.9), llm-foundry's
  default ``loss_fn: fused_crossentropy`` (``llmfoundry/models/mpt/modeling_mpt.py`` at v0.3.0,
  called on ``outputs.logits.view(-1, V)``, ``inplace_backward`` off); Liger's and quack's fused
  cross entropy keep the same.  Its forward computes each row's loss and log-sum-exp in fp32 from
  the logits and saves the logits and the log-sum-exp; its backward writes a new gradient of the
  logits in their dtype.  Per micro-batch, on one GPU (L local logits, T local tokens, e the
  bytes of one traced logit: 2 for bf16)::

      saved    = e·L + 4·T                 (the logits and the fp32 log-sum-exp)
      buffers  = e·L                       (the gradient at the loss backward, ``memory.loss_bytes``)
      forward  : one kernel reading e·L bytes
      backward : one kernel reading the logits and writing their gradient, 2·e·L bytes

  both memory bound (``op_seconds("cast", ...)``: a kernel of its own, priced on its bytes as
  given).  Under tp > 1 the head's vocabulary-parallel logits stay sharded (flash-attn's
  ``process_group``): the same bytes per local logit, its per-token statistics reduced over tp as
  the traced vocabulary-parallel softmax's are (those collectives are left as traced).

The fused ops replace the traced ones found in the graph (``traced_losses``: each forward
log-softmax an NLL reads, the casts between it and the logits, and the backward ops down to the
logits' gradient), so their saved bytes, seconds and launches are the graph's, priced at the
solved tp layout (``sharding.price``); the block ILP solves that layout on the traced loss.  Where
recomputation reruns the loss's forward (never the post part, priced without it), the fused
kernel reruns too and keeps nothing across.  Megatron-Core's own loss is
``kernels="megatron-core"``'s (``memory.MEGATRON_LOSS_BYTES``); ``EstimateOptions`` refuses the
two together.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autoplan.errors import UserError
from autoplan.ir import OpGraph, OpNode, Strategy, TensorInfo, TensorRef
from autoplan.sharding import BlockSharding, ShardingContext
from autoplan.sharding.local import bytes_per_elem, local_bytes, scaled_numel
from autoplan.sharding.price import SOFTMAX_STAT_BYTES, node_seconds, recomputed, saved_bytes

LOG_SOFTMAX = "aten._log_softmax.default"
NLL_PREFIX = "aten.nll_loss"                    # nll_loss_forward, nll_loss2d_forward
CASTS = frozenset({"aten._to_copy.default"})
# the backward ops of the traced loss: its mirrors of NLL, log-softmax and the cast
LOSS_BACKWARD_OPS = frozenset({"aten.nll_loss_backward.default", "aten.nll_loss2d_backward.default",
                               "aten._log_softmax_backward_data.default"}) | CASTS
FUSED_FORWARD_READS = 1     # logits' bytes the fused forward moves: it reads them once
FUSED_BACKWARD_MOVES = 2    # the fused backward reads them and writes their gradient


@dataclass(frozen=True)
class TracedLoss:
    """One traced cross entropy of a graph: the logits it reads and the ops a fused kernel replaces."""

    logits: TensorRef             # the head's output, before any cast
    forward: tuple[str, ...]      # the casts of the logits, the log-softmax, the NLL (views left out)
    backward: tuple[str, ...]     # NLL's and log-softmax's backward and the cast back (views left out)


def traced_losses(graph: OpGraph) -> tuple[TracedLoss, ...]:
    """Every cross entropy of ``graph`` (remembered on it): each forward log-softmax whose output
    an NLL reads (through views), with the casts between it and the logits and its backward ops."""
    cached = graph.__dict__.get("_traced_losses")
    if cached is None:
        cached = tuple(_traced(graph, n) for n in graph.ops("forward") if n.op == LOG_SOFTMAX
                       and any(u.op.startswith(NLL_PREFIX) for u in _forward_readers(graph, n)))
        object.__setattr__(graph, "_traced_losses", cached)
    return cached


def _forward_readers(graph: OpGraph, n: OpNode) -> list[OpNode]:
    return [u for u in graph.readers_through_views(n.name) if u.phase == "forward"]


def _traced(graph: OpGraph, lsm: OpNode) -> TracedLoss:
    """The ``TracedLoss`` of the log-softmax ``lsm``."""
    casts: list[str] = []
    ref = lsm.inputs[0]
    src = graph.node(ref.node)
    while src.is_view or src.op in CASTS:          # down to the logits, through views and casts
        if not src.is_view:
            casts.append(src.name)
        ref = src.inputs[0]
        src = graph.node(ref.node)
    nll = [u.name for u in _forward_readers(graph, lsm) if u.op.startswith(NLL_PREFIX)]
    forward = (*reversed(casts), lsm.name, *nll)
    backward: list[str] = []
    todo = [u for f in forward for u in graph.readers_through_views(f) if u.phase == "backward"]
    while todo:
        u = todo.pop(0)
        if u.name in backward or u.op not in LOSS_BACKWARD_OPS:
            continue
        backward.append(u.name)
        todo += [v for v in graph.readers_through_views(u.name) if v.phase == "backward"]
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    return TracedLoss(ref, forward, tuple(sorted(backward, key=order.__getitem__)))


def fused_grad_bytes(kernel: str, graph: OpGraph) -> float | None:
    """Under the ``fused`` loss kernel, the bytes per logit of the gradient its backward writes:
    one traced logit's (``memory.loss_bytes``); None under ``eager``.  UserError where ``graph``
    (the post part) traces no cross entropy to fuse."""
    if kernel == "eager":
        return None
    losses = traced_losses(graph)
    if not losses:
        raise UserError("the loss kernel 'fused' finds no traced cross entropy (a log-softmax an NLL reads) "
                        "after the blocks", "price the model's loss as traced: --loss-kernel eager")
    return bytes_per_elem(_logits(graph, losses[0]))


def _logits(graph: OpGraph, loss: TracedLoss) -> TensorInfo:
    t = graph.tensor(loss.logits)
    assert t is not None, loss.logits                 # the head's GEMM has its output
    return t


@dataclass(frozen=True)
class _Delta:
    """What a fused kernel adds to a ``BlockSharding``'s fields of the same names (negative: takes
    away): seconds, launches, bytes."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    recompute_s: float = 0.0
    forward_launches: int = 0
    backward_launches: int = 0
    saved_bytes: float = 0.0
    b_freed_bytes: float = 0.0


def with_loss_kernel(kernel: str, bs: BlockSharding, graph: OpGraph,
                     pricing: Callable[[], tuple[ShardingContext, Mapping[str, Strategy]]]) -> BlockSharding:
    """``bs`` with each traced cross entropy replaced by the fused kernel (module docstring) under
    ``kernel="fused"``; ``bs`` itself otherwise.  ``pricing()``: the context that priced ``bs``
    and each node's strategy (``tp.BlockLayouts.pricing``)."""
    losses = traced_losses(graph) if kernel == "fused" else ()
    if not losses:
        return bs
    ctx, chosen = pricing()
    deltas = [_replaced(graph, ctx, chosen, loss) for loss in losses]
    return dataclasses.replace(bs, **{f.name: getattr(bs, f.name) + sum(getattr(d, f.name) for d in deltas)
                                      for f in dataclasses.fields(_Delta)})


def _replaced(graph: OpGraph, ctx: ShardingContext, chosen: Mapping[str, Strategy], loss: TracedLoss) -> _Delta:
    """The fused kernel less the traced ops of ``loss`` at the layout ``chosen`` (each node's strategy)
    priced under ``ctx``, one micro-batch."""
    fwd = [graph.node(name) for name in loss.forward]
    bwd = [graph.node(name) for name in loss.backward]
    rerun = any(recomputed(graph, n, ctx.recompute) for n in fwd)
    traced_f = sum(node_seconds(n, chosen[n.name], ctx) for n in fwd)
    traced_b = sum(node_seconds(n, chosen[n.name], ctx) for n in bwd)
    kept = [saved_bytes(graph, n, chosen[n.name], ctx) for n in fwd]
    freed = graph.freed_at_input_grad_nodes()
    logits = _logits(graph, loss)
    placement = chosen[loss.logits.node].outputs[loss.logits.index]       # sharded under a vocabulary-parallel head
    logit_bytes = local_bytes(logits, placement, ctx.tp, ctx.mbs, ctx.cp)
    tokens = scaled_numel(logits, ctx.mbs, ctx.cp) / logits.shape[-1]
    fused_f = ctx.op_seconds("cast", 0.0, FUSED_FORWARD_READS * logit_bytes, None)
    fused_b = ctx.op_seconds("cast", 0.0, FUSED_BACKWARD_MOVES * logit_bytes, None)
    fused_kept = 0.0 if rerun else logit_bytes + tokens * SOFTMAX_STAT_BYTES
    runs = 2 if rerun else 1
    return _Delta(
        forward_s=fused_f - traced_f,
        backward_s=fused_b - traced_b + (runs - 1) * (fused_f - traced_f),
        recompute_s=(runs - 1) * (fused_f - traced_f),
        forward_launches=1 - len(fwd), backward_launches=(1 - len(bwd)) + (runs - 1) * (1 - len(fwd)),
        saved_bytes=fused_kept - sum(kept),
        b_freed_bytes=fused_kept - sum(b for n, b in zip(fwd, kept) if n.name in freed))
