"""Which strategies of a node the block ILP may choose on the tp axis.

A node's candidates are the strategies DTensor's registry gave the frontend, plus three rule
sets DTensor does not offer (vocabulary-parallel cross entropy; same-shape unary ops in any
layout of their input; attention with replicated KV heads under GQA).  They stay here rather than
in the frontend so that the traced IR
(which is cached on disk) holds exactly what DTensor said.  A candidate is *legal* when

* every sharded dim divides by tp on the local shard (micro-batch mbs, 1/cp of the sequence);
* a dim of role seq/tokens of an activation is sharded only with sequence parallelism on
  (a batch dim has size 1 at the traced micro-batch, so only a batch·heads dim can be sharded,
  which shards heads);
* with SP on, Megatron's rule holds: nothing outside a GEMM runs on a replicated sequence (a
  non-GEMM op may not output a replicated activation with a sequence dim), so norms, dropout
  and residual adds run sequence-sharded and only GEMM inputs are all-gathered;
* the residual stream between blocks is sequence-sharded with SP, else replicated.
"""
from __future__ import annotations

from autoplan.ir import OpGraph, OpNode, Strategy, TensorInfo, TensorRef
from autoplan.opkinds import is_attention_kernel
from autoplan.routing import routed_region
from autoplan.sharding.local import SEQ_ROLES, local_dim
from autoplan.sharding.placements import shard_dim
from autoplan.sharding.types import ShardingContext

FLOAT_DTYPES = ("bf16", "fp16", "fp32", "fp64", "fp8")


def placement_ok(t: TensorInfo | None, pl: str | None, ctx: ShardingContext, activation: bool) -> bool:
    if t is None or pl is None:
        return True
    if pl == "P":
        return t.dtype in FLOAT_DTYPES
    d = shard_dim(pl)
    if d is None:
        return True
    if d < 0:
        d += len(t.shape)
    if d >= len(t.shape):
        return False
    role = t.dim_roles[d] if d < len(t.dim_roles) else ""
    if activation and role in SEQ_ROLES and not ctx.sp:
        return False
    local = local_dim(t, d, ctx.mbs, ctx.cp)
    return local >= ctx.tp and float(local / ctx.tp).is_integer()


def _replicated_sequence(n: OpNode, s: Strategy, ctx: ShardingContext) -> bool:
    """Under SP, a non-GEMM compute op that leaves an activation with a sequence dim replicated."""
    if not ctx.sp or n.op == "placeholder" or n.gemm is not None or n.is_view or n.role == "param":
        return False
    return any(p == "R" and t is not None and t.dtype in FLOAT_DTYPES
               and any(r in ("seq", "tokens") for r in t.dim_roles)
               for t, p in zip(n.outputs, s.outputs))


def _placeholder_strategies(n: OpNode) -> tuple[Strategy, ...]:
    t = n.out
    if t is None:
        return (Strategy((), ("R",)),)
    pls = ["R"] + [f"S({d})" for d in range(len(t.shape))]
    return tuple(Strategy((), (p,)) for p in pls)


def _boundary_strategies(n: OpNode, cands: tuple[Strategy, ...], ctx: ShardingContext) -> tuple[Strategy, ...]:
    """The residual stream between blocks: sequence-sharded with SP (Megatron's layout), else replicated."""
    want = "R"
    if ctx.sp and n.out is not None:
        seq = [d for d, r in enumerate(n.out.dim_roles) if r in ("seq", "tokens")]
        if seq and placement_ok(n.out, f"S({seq[0]})", ctx, activation=True):
            want = f"S({seq[0]})"
    return tuple(s for s in cands if s.outputs[0] == want) or cands[:1]



def _vocab_parallel_rules(n: OpNode) -> tuple[Strategy, ...]:
    """Vocab-parallel cross entropy (Megatron; torch's ``loss_parallel``), which DTensor's
    registry does not offer: log-softmax and NLL on logits sharded over the vocabulary dim,
    reduced by all-reducing per-token statistics (see ``_intrinsic``).  NLL takes (N, C)
    log-probs, so its vocab dim is 1; log-softmax works on the last dim."""
    if n.out is None:
        return ()
    last = f"S({len(n.out.shape) - 1})"
    rules = {
        "aten._log_softmax.default": (1, Strategy((last,), (last,))),
        "aten._log_softmax_backward_data.default": (2, Strategy((last, last), (last,))),
        "aten.nll_loss_forward.default": (2, Strategy(("S(1)", "R"), ("P", "R"))),
        "aten.nll_loss_backward.default": (4, Strategy(("R", "S(1)", "R", "R"), ("S(1)",))),
    }
    arity, rule = rules.get(n.op, (-1, None))
    return (rule,) if rule is not None and len(n.inputs) == arity else ()


def _replicated_kv_rules(graph: OpGraph, n: OpNode, inputs: list[TensorRef]) -> tuple[Strategy, ...]:
    """GQA attention with query heads sharded and K/V heads replicated on every tp rank.

    DTensor shards q, k and v on the heads dim alike, so with fewer KV heads than tp ranks it
    has no sharded attention and the whole kernel would run replicated on every rank.  Megatron
    (and vLLM) replicate KV heads instead: each rank runs its heads/tp query heads against the
    KV heads they share.  Derived from the head-sharded strategy: every operand whose heads dim
    (dim 1) differs from the query's — K and V, forward and backward — is replicated, and their
    gradients leave the backward kernel as partial sums (each rank adds its query heads' share)."""
    if not is_attention_kernel(n) or not inputs:
        return ()
    q = graph.tensor(inputs[0])
    if q is None or len(q.shape) != 4:
        return ()

    def kv(t: TensorInfo | None) -> bool:
        return t is not None and len(t.shape) == 4 and t.shape[1] != q.shape[1]

    out = []
    for s in n.strategies:
        if not s.inputs or s.inputs[0] != "S(1)":
            continue
        ins = tuple("R" if p == "S(1)" and kv(graph.tensor(r)) else p for r, p in zip(inputs, s.inputs))
        outs = tuple("P" if p == "S(1)" and kv(t) else p for t, p in zip(n.outputs, s.outputs))
        if ins != s.inputs or outs != s.outputs:
            out.append(Strategy(ins, outs))
    return tuple(out)


def _identity_rules(n: OpNode) -> tuple[Strategy, ...]:
    """Same-shape unary ops run in any layout of their input.

    DTensor derives a follow-the-input op's strategies from the layouts its producer offered
    when the frontend enumerated them; a layout the ILP adds later (vocab-parallel logits)
    would otherwise find no strategy on ``detach`` or a dtype cast.  Views, detach and
    casts are linear, so a partial sum stays partial; other elementwise ops only shard."""
    if len(n.inputs) != 1 or n.out is None or len(n.outputs) != 1 or not n.strategies:
        return ()
    if not all(len(s.inputs) == 1 and s.outputs and s.inputs[0] == s.outputs[0] for s in n.strategies):
        return ()
    linear = n.is_view or n.op in ("aten._to_copy.default", "aten.clone.default", "aten.detach.default")
    known = {s.inputs[0] for s in n.strategies}
    pls = [f"S({d})" for d in range(len(n.out.shape))] + (["P"] if linear else [])
    return tuple(Strategy((p,), (p,)) for p in pls if p not in known)


def legal_strategies(graph: OpGraph, n: OpNode, inputs: list[TensorRef], ctx: ShardingContext) -> list[Strategy]:
    """The node's strategies that respect divisibility, the sp rules and the block boundary.

    ``inputs``: the node's inputs with deduplicated views resolved to the view kept.  A node of
    the routed-expert region (``autoplan.routing``) has one: ``routed_strategy``."""
    if n.name in routed_region(graph):
        return [routed_strategy(graph, n, inputs, ctx)]
    if n.op == "placeholder":
        cands = _placeholder_strategies(n)
        if n.role in ("input", "tangent"):
            cands = _boundary_strategies(n, cands, ctx)
    else:
        cands = (tuple(n.strategies or (replicated(n),)) + _vocab_parallel_rules(n) + _identity_rules(n)
                 + _replicated_kv_rules(graph, n, inputs))
    ok = []
    for s in cands:
        if len(s.inputs) != len(n.inputs) and n.op != "placeholder":
            continue
        ins_ok = all(placement_ok(graph.tensor(r), p, ctx, graph.node(r.node).role != "param")
                     for r, p in zip(inputs, s.inputs))
        outs_ok = all(placement_ok(t, p, ctx, n.role != "param") for t, p in zip(n.outputs, s.outputs))
        if ins_ok and outs_ok and not _replicated_sequence(n, s, ctx):
            ok.append(s)
    return ok or [replicated(n)]   # every op can run replicated


def routed_strategy(graph: OpGraph, n: OpNode, inputs: list[TensorRef], ctx: ShardingContext) -> Strategy:
    """The one layout of a routed-expert node (``autoplan.routing``): an engine routes each GPU's
    own tokens, so every tensor of the region with a token dim is sharded on it as the residual
    stream is (sequence-sharded under SP, ``engine_placement``) and the rest, the expert weights
    and the router included, is whole; the ILP neither prices nor changes it (``cost.ep`` does)."""
    ins = tuple("R" if graph.node(r.node).role == "param" else engine_placement(graph.tensor(r), ctx) for r in inputs)
    outs = tuple(None if t is None else ("R" if n.role == "param" else engine_placement(t, ctx)) for t in n.outputs)
    return Strategy(ins, outs)


def engine_placement(t: TensorInfo | None, ctx: ShardingContext) -> str:
    """A routed tensor's placement: its first token dim (seq or tokens) sharded under SP where tp
    divides it, else replicated."""
    if t is None or not ctx.sp:
        return "R"
    for d, role in enumerate(t.dim_roles):
        if role in SEQ_ROLES:
            pl = f"S({d})"
            return pl if placement_ok(t, pl, ctx, activation=True) else "R"
    return "R"


def replicated(n: OpNode) -> Strategy:
    return Strategy(tuple("R" for _ in n.inputs), tuple(None if t is None else "R" for t in n.outputs))


