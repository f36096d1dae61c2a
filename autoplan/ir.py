"""The intermediate representation every later stage reads: OpGraph and BlockGraph.

Plain frozen dataclasses, no torch types, JSON round-trippable. The frontend
(`autoplan.frontend`) is the only producer; the cost model, the search, the
explainer and the exporters only read these.

Vocabulary
----------
* **dim**: a tensor dimension. **axis**: a mesh axis (tp, cp, ep, dp, pp).
* A tensor's ``dim_roles`` says what each dim is: ``"batch"``, ``"seq"``
  (scales with the sequence length: tokens, query or key positions), or ``""``
  (a model dim: hidden, heads, head_dim, ffn, vocab, experts...).  The
  frontend also writes ``"tokens"`` (a flattened batch·seq dim, or one that
  scales with it: MoE choices, expert capacity) and ``"expert"`` (an experts
  dim of an MoE layer).
* **Placement** strings on the tp axis, as DTensor spells them: ``"R"``
  (replicate), ``"S(d)"`` (shard tensor dim d), ``"P"`` (partial sum).

Graph conventions
-----------------
An OpGraph is the joint forward+backward ATen graph of one traced region (one
block, or the pre/post part of the model) at micro-batch 1 and the traced
sequence length.  Per-token quantities scale linearly with the micro-batch;
the frontend records ``seq_len`` so that consumers know the traced length
(and ``batch`` when a trace was asked for at another micro-batch).

Node inputs are ``TensorRef``s: (producer node name, output index).  A node with
``op == "placeholder"`` is a graph input: a parameter (role ``"param"``), the
activation entering the region (``"input"``), another input that gets no
gradient such as rotary tables, masks or labels (``"side_input"``), a buffer
(``"buffer"``), or the gradient flowing into the region's output in backward
(``"tangent"``).  The ``"output"`` node lists what
the region returns: forward outputs, and the gradients of params and inputs.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from math import prod
from typing import Any

from costmodels.memo import kept_hash, without_kept_hash

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1, "fp8": 1}

ROLES = ("param", "input", "tangent", "activation", "grad", "param_grad", "loss", "output", "buffer",
         "side_input")


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor value, with the role of each dim."""

    shape: tuple[int, ...]
    dtype: str
    dim_roles: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Bytes of the whole (unsharded) tensor."""
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    def dims_with_role(self, role: str) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.dim_roles) if r == role)


@dataclass(frozen=True)
class TensorRef:
    """Output ``index`` of node ``node``."""

    node: str
    index: int = 0


@dataclass(frozen=True)
class Strategy:
    """One legal way to run a node on the tp axis.

    ``inputs[i]`` is the placement the node needs for its i-th tensor input,
    ``outputs[j]`` the placement of its j-th output (None for non-tensor
    outputs).  The name follows Alpa's style, e.g. ``"S(1)<-R,S(1)"``.
    """

    inputs: tuple[str, ...]
    outputs: tuple[str | None, ...]

    @property
    def name(self) -> str:
        outs = ",".join(o or "-" for o in self.outputs)
        return f"{outs}<-{','.join(self.inputs)}"


@dataclass(frozen=True)
class OpNode:
    """One ATen op (or graph input/output) of a traced region.

    Costs are for the whole unsharded op at micro-batch 1:
    ``flops`` (FLOPs, multiply-add = 2), ``bytes_read`` / ``bytes_written``
    (bytes of tensor inputs / outputs, an HBM-traffic lower bound).
    ``gemm`` is (M, N, K) for matrix multiplies (batch folded into M), else None.
    """

    name: str
    op: str                                  # "aten.mm.default", "placeholder", "output"
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorInfo | None, ...]
    phase: str = "forward"                   # forward | backward
    role: str = "activation"                 # see ROLES
    module: str = ""                         # module path, e.g. "layers.0.attn.q_proj"
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    gemm: tuple[int, int, int] | None = None
    saved: bool = False                      # an output is saved for backward
    wgrad: bool = False                      # backward work that only feeds weight gradients
    is_view: bool = False                    # view/alias: no data movement
    param: str = ""                          # for param placeholders / param grads: parameter name
    strategies: tuple[Strategy, ...] = ()
    saved_outputs: tuple[int, ...] = ()      # which outputs are saved (empty + saved: all)
    attention_window: int = 0                # SDPA kernels: sliding window in keys (0: full attention);
                                             # ``flops`` already counts only the band
    attention_causal: bool = False           # SDPA kernels: called with is_causal (``flops`` stays full s²)

    @property
    def out(self) -> TensorInfo | None:
        return self.outputs[0] if self.outputs else None


@dataclass(frozen=True)
class OpGraph:
    """A joint forward+backward ATen graph in topological order."""

    nodes: tuple[OpNode, ...]
    seq_len: int
    dtype: str = "bf16"
    # One label per input of the "output" node, in order: "activation" (a forward output),
    # "loss", "input_grad:<placeholder name>" (gradient of an activation input) or
    # "param_grad:<placeholder name>" (gradient of a parameter placeholder).
    output_roles: tuple[str, ...] = ()
    batch: int = 1                           # traced micro-batch (shapes carry it)

    def node(self, name: str) -> OpNode:
        return self._index()[name]

    def __hash__(self) -> int:
        """Hashed whole, once: a graph keys the sharding memos (``sharding.prepare``)."""
        return kept_hash(self)

    __getstate__ = without_kept_hash

    def _index(self) -> dict[str, OpNode]:
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_idx", idx)
        return idx

    def tensor(self, ref: TensorRef) -> TensorInfo | None:
        outs = self.node(ref.node).outputs
        return outs[ref.index] if ref.index < len(outs) else None

    def ops(self, phase: str | None = None) -> Iterable[OpNode]:
        """Compute nodes (not placeholders/outputs), optionally of one phase."""
        for n in self.nodes:
            if n.op in ("placeholder", "output"):
                continue
            if phase is None or n.phase == phase:
                yield n

    def params(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.nodes if n.op == "placeholder" and n.role == "param")

    @property
    def param_count(self) -> int:
        return sum(n.out.numel for n in self.params())  # type: ignore[union-attr,misc]  # a param has its tensor

    def flops(self, phase: str | None = None) -> float:
        return sum(n.flops for n in self.ops(phase))

    def saved_outputs(self) -> frozenset[TensorRef]:
        """Forward outputs that backward reads (through views: a view read in backward keeps its base)."""
        cached = self.__dict__.get("_saved")
        if cached is not None:
            return cached
        saved: set[TensorRef] = set()
        for n in reversed(self.nodes):
            if n.phase != "backward" and not (n.is_view and any(TensorRef(n.name, i) in saved
                                                               for i in range(len(n.outputs)))):
                continue
            for r in n.inputs:
                if self.node(r.node).phase == "forward":
                    saved.add(r)
        out = frozenset(saved)
        object.__setattr__(self, "_saved", out)
        return out

    def wgrad_held_outputs(self) -> frozenset[TensorRef]:
        """Input-gradient values the weight-gradient ops read: what a schedule that splits the
        backward into B (input gradients) and W (weight gradients) keeps from a micro-batch's B
        until its W, beside the saved activations — the gradient flowing into every weight op
        (dY of ``dW = dYᵀ·X``).  Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR'24) §2: W
        needs the output gradient and the input of each weight op; torch's
        ``pipelining/_backward.stage_backward_input`` keeps them per weight op for
        ``stage_backward_weight``.  Outputs of non-weight-gradient backward ops read by a
        weight op's backward, through views (a view of dY keeps dY): by a weight-gradient op
        (``wgrad``), or by a backward op that returns a weight gradient beside the input
        gradient (``fused_wgrad_nodes``: a norm's backward returns dX, dγ, dβ; torch hooks its
        dY too)."""
        cached = self.__dict__.get("_wgrad_held")
        if cached is not None:
            return cached
        held: set[TensorRef] = set()
        fused = self.fused_wgrad_nodes()
        todo = [r for n in self.nodes if n.phase == "backward" and (n.wgrad or n.name in fused) for r in n.inputs]
        while todo:
            r = todo.pop()
            src = self.node(r.node)
            if src.phase != "backward" or src.wgrad or src.role == "param":
                continue
            if src.is_view:
                todo += src.inputs
            else:
                held.add(r)
        out = frozenset(held)
        object.__setattr__(self, "_wgrad_held", out)
        return out

    def wgrad_input_nodes(self) -> frozenset[str]:
        """Forward nodes whose saved outputs a weight-gradient op reads (through views): the input
        X of each ``dW = dYᵀ·X``.  What an engine that defers only its linears' weight gradients
        keeps from B to W besides their output gradients — Megatron's ``WeightGradStore`` (the
        sail-sg Zero Bubble fork: each linear's backward computes dX in B and stores
        (X, dY) for W, ``megatron/core/tensor_parallel/layers.py``), where B is an ordinary autograd
        backward that frees every other saved tensor."""
        cached = self.__dict__.get("_wgrad_inputs")
        if cached is not None:
            return cached
        found: set[str] = set()
        todo = [r for n in self.nodes if n.phase == "backward" and n.wgrad for r in n.inputs]
        while todo:
            r = todo.pop()
            src = self.node(r.node)
            if src.phase != "forward" or src.role == "param":
                continue
            if src.is_view and src.op != "placeholder":
                todo += src.inputs
            else:
                found.add(src.name)
        out = frozenset(found)
        object.__setattr__(self, "_wgrad_inputs", out)
        return out

    def freed_at_input_grad_nodes(self) -> frozenset[str]:
        """Forward nodes whose saved outputs a split backward frees at B (input gradients), not
        at W: every backward reader of them (through views) runs upstream of every weight op's
        backward — before the gradient reaches a weight — as the loss's log-softmax output above
        the LM head.  torch's ``stage_backward_input`` detaches the stage output after B, so only
        the autograd nodes the weight ops' intermediates reach (their inputs' side) survive to W;
        what lies between the output and the first weight op is freed.  Per graph: in a block
        this is the tail of its last residual branch, which the next block's weight ops reach
        unless the block ends its stage (the cost model counts only the post part's,
        ``cost.parts``)."""
        cached = self.__dict__.get("_freed_at_b")
        if cached is not None:
            return cached
        refs = self._readers()

        def reading(name: str) -> list[OpNode]:
            """The nodes reading any output of node ``name``."""
            return [u for i in range(len(self.node(name).outputs)) for u in refs.get(TensorRef(name, i), [])]

        below: set[str] = set()          # backward nodes downstream of a weight op's dY
        todo = [u.name for r in self.wgrad_held_outputs() for u in reading(r.node)]
        while todo:
            name = todo.pop()
            if name in below:
                continue
            below.add(name)
            todo += [u.name for u in reading(name) if u.phase == "backward"]

        saved = {r.node for r in self.saved_outputs()}
        found = frozenset(name for name in saved if self.node(name).phase == "forward"
                          and self.node(name).role != "param"
                          and all(u.name not in below for u in self.readers_through_views(name)
                                  if u.phase == "backward"))
        object.__setattr__(self, "_freed_at_b", found)
        return found

    def fused_wgrad_nodes(self) -> frozenset[str]:
        """Backward ops that feed an input gradient and also return a weight gradient: a
        non-``wgrad`` backward node with an output read only by ``wgrad`` nodes or returned as a
        parameter gradient (``native_layer_norm_backward``'s dγ, dβ)."""
        readers = self._readers()
        returned = {r for n in self.nodes if n.op == "output"
                    for r, role in zip(n.inputs, self.output_roles) if role.startswith("param_grad:")}

        def weight_only(r: TensorRef) -> bool:
            users = readers.get(r, [])
            return (r in returned or bool(users)) and all(u.wgrad or (u.op == "output" and r in returned)
                                                          for u in users)

        return frozenset(n.name for n in self.ops("backward") if not n.wgrad and not n.is_view
                         and any(weight_only(TensorRef(n.name, i)) for i in range(len(n.outputs))))

    def readers_through_views(self, name: str, index: int | None = None) -> list[OpNode]:
        """The non-view nodes reading node ``name``'s outputs (output ``index`` alone when given),
        through views (a view's readers read its base), every phase, depth first in graph order."""
        out: list[OpNode] = []
        refs = self._readers()
        for i in range(len(self.node(name).outputs)) if index is None else (index,):
            for u in refs.get(TensorRef(name, i), []):
                out += self.readers_through_views(u.name) if u.is_view else [u]
        return out

    def _readers(self) -> dict[TensorRef, list[OpNode]]:
        """The nodes reading each value, in graph order (remembered)."""
        cached = self.__dict__.get("_reader_index")
        if cached is None:
            cached = {}
            for n in self.nodes:
                for r in n.inputs:
                    cached.setdefault(r, []).append(n)
            object.__setattr__(self, "_reader_index", cached)
        return cached

    def saved_bytes(self) -> float:
        """Bytes of forward values kept for backward (micro-batch 1, unsharded)."""
        total = 0.0
        for n in self.nodes:
            if n.saved and n.role != "param":
                idx = n.saved_outputs or range(len(n.outputs))
                total += sum(n.outputs[i].nbytes for i in idx if n.outputs[i] is not None)  # type: ignore[union-attr,misc]
        return total


@dataclass(frozen=True)
class Block:
    """One unique block kind: its graph and how often it repeats."""

    kind: str                 # stable id, e.g. "dense0", "moe0"
    graph: OpGraph
    count: int
    module_paths: tuple[str, ...] = ()   # the instances, e.g. ("layers.0", ...)
    description: str = ""                # "attention + swiglu MLP", "attention + MoE(8 experts, top-2)"


@dataclass(frozen=True)
class ModelInfo:
    """Model-level facts the cost model and baselines need (all plain numbers)."""

    name: str
    family: str = ""          # gpt | llama | moe | hf | custom
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    expert_groups: int = 0    # group-limited routing (DeepSeek-V3): experts in this many groups, a token's
    topk_groups: int = 0      # top-k drawn from its best ``topk_groups`` of them (0: no grouping)
    tied_embeddings: bool = False
    notes: tuple[str, ...] = ()
    # What the model's inputs are: token ids ([batch, seq] integers) or not (pixels, features).
    # ``throughput_unit`` is what one step's throughput counts: "tokens" for token models, else
    # "samples"; ``positions`` the sequence length the blocks see per sample (the traced seq for
    # token models; 257 for ViT-H/14 at 224 px), 0 when unknown.
    token_inputs: bool = True
    throughput_unit: str = "tokens"
    positions: int = 0
    encoder_layers: int = 0    # encoder-decoder: layers of the encoder stack (the first ``encoder_layers``
                               # of ``order``)
    sliding_window: int = 0    # keys a sliding-window layer attends to (0: none); per-layer windows are on the ops
    v_head_dim: int = 0        # value head size when it differs from ``head_dim`` (MLA: q/k 192, v 128), else 0
    # Multi-head latent attention (DeepSeek-V2/V3; 0: none): the kv and q latent ranks and the rotary slice
    # of ``head_dim`` (the q/k head: DeepSeek-V3 128 + 64, v 128); engines' MLA arguments need them.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_dim: int = 0
    mtp_layers: int = 0        # multi-token-prediction modules after the last layer (DeepSeek-V3: 1), traced in post
    attention: str = ""        # attention implementation the model was built with ("sdpa", "eager"; "" unknown)


@dataclass(frozen=True)
class BlockGraph:
    """A model as repeated blocks: ``pre`` → ``order`` of block kinds → ``post``.

    ``pre`` holds the embedding (and anything before the first block); ``post``
    the final norm, the output head and the loss.  ``order`` lists the block
    kind of every layer, first to last (``len(order)`` = number of layers).
    """

    model: ModelInfo
    blocks: tuple[Block, ...]
    order: tuple[str, ...]
    pre: OpGraph
    post: OpGraph
    seq_len: int
    dtype: str = "bf16"
    trace_seconds: float = 0.0
    trace_peak_rss_bytes: int = 0
    batch: int = 1                           # traced micro-batch (graphs carry it in their shapes)

    def block(self, kind: str) -> Block:
        for b in self.blocks:
            if b.kind == kind:
                return b
        raise KeyError(kind)

    @property
    def num_layers(self) -> int:
        return len(self.order)

    @property
    def param_count(self) -> int:
        """Total parameters (tied weights counted once)."""
        return (self.pre.param_count + self.post.param_count
                + sum(b.graph.param_count * b.count for b in self.blocks)
                - self._tied_param_count())

    def _tied_param_count(self) -> int:
        if not self.model.tied_embeddings:
            return 0
        # ignore[union-attr]: a param has its tensor (mypy does not narrow n.outputs[i] by the test either)
        pre_names = {n.param: n.out.numel for n in self.pre.params()}  # type: ignore[union-attr]
        return sum(n.out.numel for n in self.post.params() if n.param in pre_names)  # type: ignore[union-attr,misc]

    def flops_per_step_per_sample(self) -> float:
        """Forward+backward FLOPs of one sequence (micro-batch 1), no recompute."""
        return (self.pre.flops() + self.post.flops()
                + sum(b.graph.flops() * b.count for b in self.blocks)) / self.batch

    @property
    def flops_per_token(self) -> float:
        return self.flops_per_step_per_sample() / self.seq_len

    @property
    def sample_positions(self) -> int:
        """Sequence positions one sample puts through the blocks: the traced ``seq_len`` for token
        models; for other inputs (pixels, features) what the frontend read off the first block's
        input (257 patches for ViT-H/14 at 224 px), since ``--seq`` does not reach them."""
        if self.model.token_inputs or not self.model.positions:
            return self.seq_len
        return self.model.positions

    @property
    def throughput_unit(self) -> str:
        """What throughput counts: "tokens" for token-id inputs, else "samples"."""
        return self.model.throughput_unit

    # --- JSON ---------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> BlockGraph:
        return _blockgraph_from_dict(json.loads(text))


def _graph_from_dict(d: dict[str, Any]) -> OpGraph:
    nodes = []
    for n in d["nodes"]:
        nodes.append(OpNode(
            name=n["name"], op=n["op"],
            inputs=tuple(TensorRef(**r) for r in n["inputs"]),
            outputs=tuple(None if t is None else TensorInfo(tuple(t["shape"]), t["dtype"], tuple(t["dim_roles"]))
                          for t in n["outputs"]),
            phase=n["phase"], role=n["role"], module=n["module"], flops=n["flops"],
            bytes_read=n["bytes_read"], bytes_written=n["bytes_written"],
            gemm=None if n["gemm"] is None else tuple(n["gemm"]),
            saved=n["saved"], wgrad=n["wgrad"], is_view=n["is_view"], param=n["param"],
            strategies=tuple(Strategy(tuple(s["inputs"]), tuple(s["outputs"])) for s in n["strategies"]),
            saved_outputs=tuple(n.get("saved_outputs", ())),
            attention_window=n.get("attention_window", 0),
            attention_causal=n.get("attention_causal", False),
        ))
    return OpGraph(nodes=tuple(nodes), seq_len=d["seq_len"], dtype=d["dtype"],
                   output_roles=tuple(d.get("output_roles", ())), batch=d.get("batch", 1))


def _blockgraph_from_dict(d: dict[str, Any]) -> BlockGraph:
    m = dict(d["model"])
    m["notes"] = tuple(m.get("notes", ()))
    return BlockGraph(
        model=ModelInfo(**m),
        blocks=tuple(Block(kind=b["kind"], graph=_graph_from_dict(b["graph"]), count=b["count"],
                           module_paths=tuple(b["module_paths"]), description=b["description"])
                     for b in d["blocks"]),
        order=tuple(d["order"]),
        pre=_graph_from_dict(d["pre"]),
        post=_graph_from_dict(d["post"]),
        seq_len=d["seq_len"], dtype=d["dtype"],
        trace_seconds=d["trace_seconds"], trace_peak_rss_bytes=d["trace_peak_rss_bytes"],
        batch=d.get("batch", 1),
    )
