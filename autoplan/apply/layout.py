"""What ``apply`` needs to know about a model, found by running it once on a tiny batch.

No module names are assumed.  The probe finds

* the **block stack**: the ``nn.ModuleList`` / ``nn.Sequential`` holding the most
  parameters; pipeline stages are cut between its entries.  The model's forward
  must call the blocks in order, each taking the residual stream [batch, seq,
  hidden] as its first positional argument and returning it;
* the **region** of every parameter outside the blocks: ``pre`` if some torch
  function reads it before the first block runs (token/position embeddings),
  ``post`` if after the last block (final norm, output head), both for a tied
  embedding/head weight.  The first pipeline stage owns ``pre`` parameters, the
  last stage ``post`` ones;
* a **default tp role** per parameter (Megatron's rules, found on the data flow,
  not on names):

  - an ``nn.Linear`` inside a block whose input depends on the output of another
    ``nn.Linear`` of the same block (through attention, activations, products)
    is *row-parallel* (weight ``S(1)``) and the Linears it depends on are
    *column-parallel* (weight ``S(0)``); a Linear in no such pair (a MoE router)
    is replicated;
  - an ``nn.Linear`` after the blocks (the output head) is column-parallel
    (vocabulary-parallel logits), and so is any weight passed to ``F.linear``
    after the blocks (a head applied functionally, tied or not);
  - an ``nn.Embedding`` is vocabulary-parallel (weight ``S(0)``);
  - the weights of an experts module (``expert_parallel.expert_count``: own parameters ≥3-D with
    one leading size E) are sharded by expert (``S(0)``) when tp divides E (what the block ILP
    picks for the zoo's MoE, so a bare plan runs the layout its estimate priced);
  - every other parameter (norms) is replicated.

Dependencies are tracked with a ``TorchFunctionMode`` that labels every tensor a
torch function returns with the union of its inputs' labels; a Linear's output
is labelled with the Linear itself.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from autoplan.errors import UserError

COLWISE, ROWWISE, REPLICATE, EMBEDDING = "colwise", "rowwise", "replicate", "embedding"


@dataclass(frozen=True)
class ModelLayout:
    """The structure of one model as ``apply`` sees it (parameter names are the model's FQNs)."""

    blocks_path: str                          # FQN of the block stack, e.g. "layers"
    num_blocks: int
    pre: frozenset[str]                       # parameters read before the first block
    post: frozenset[str]                      # parameters read after the last block
    roles: dict[str, str]                     # module FQN -> colwise | rowwise | replicate | embedding
    index_ndim: dict[str, int]                # Embedding FQN -> ndim of its index tensor
    stream_shaped: frozenset[str]             # module FQNs whose output has the residual shape
    head_weights: frozenset[str] = frozenset()  # parameters used as F.linear weights after the blocks
    vocab: int = 0                            # rows of the first embedding called (0: none)
    block_params: dict[int, tuple[str, ...]] = field(default_factory=dict)  # block -> relative names

    def block_prefix(self, i: int) -> str:
        return f"{self.blocks_path}.{i}."

    def block_of(self, name: str) -> int | None:
        """Index of the block holding parameter/module ``name``, or None outside the blocks."""
        prefix = self.blocks_path + "."
        if not name.startswith(prefix):
            return None
        return int(name[len(prefix):].split(".", 1)[0])


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList | nn.Sequential]:
    """The ModuleList/Sequential with the most parameters (ties: the first in module order)."""
    best, best_n = None, 0
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0:
            n = sum(p.numel() for p in module.parameters())
            if n > best_n:
                best, best_n = (name, module), n
    if best is None:
        raise UserError(f"{type(model).__name__} has no nn.ModuleList or nn.Sequential of blocks",
                        "keep the repeated transformer blocks in an nn.ModuleList that forward() "
                        "iterates; apply cuts pipeline stages between its entries")
    return best


class _Labels(TorchFunctionMode):
    """Records which parameters each region reads and propagates Linear labels."""

    def __init__(self, param_names: dict[int, str]) -> None:
        super().__init__()
        self.param_names = param_names
        self.region = "pre"
        self.used: dict[str, set[str]] = {}
        self.head_weights: set[str] = set()
        self.labels: dict[int, frozenset[str]] = {}
        self.alive: list[torch.Tensor] = []     # keep labelled tensors alive: ids stay unique

    def label(self, t: torch.Tensor, value: frozenset[str]) -> None:
        self.labels[id(t)] = value
        self.alive.append(t)

    def labels_of(self, obj) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for leaf in tree_flatten(obj)[0]:
            if isinstance(leaf, torch.Tensor):
                out |= self.labels.get(id(leaf), frozenset())
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = tree_flatten((args, kwargs))[0]
        for leaf in inputs:
            if isinstance(leaf, nn.Parameter) and id(leaf) in self.param_names:
                self.used.setdefault(self.param_names[id(leaf)], set()).add(self.region)
        if self.region == "post" and func is F.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if isinstance(weight, nn.Parameter) and id(weight) in self.param_names:
                self.head_weights.add(self.param_names[id(weight)])
        out = func(*args, **kwargs)
        if self.region == "block":
            value = self.labels_of(inputs)
            if value:
                for leaf in tree_flatten(out)[0]:
                    if isinstance(leaf, torch.Tensor):
                        self.label(leaf, value | self.labels.get(id(leaf), frozenset()))
        return out


def probe_on_meta(build, mbs: int) -> tuple[nn.Module, ModelLayout]:
    """(model, layout) of ``build()`` built and probed on the meta device (no memory, no weights),
    in its training configuration as ``apply`` runs it (``outputs.training_config``: an HF MoE's
    fp32 experts cannot probe under ``grouped_mm``), with transformers' packed-sequence check
    (which reads position values, none on meta) off: every row is one sequence."""
    from autoplan.apply.outputs import training_config
    from autoplan.frontend.hf import unpacked_sequences

    with torch.device("meta"), unpacked_sequences():
        model = training_config(build())
        return model, probe(model, torch.zeros(mbs, 2, dtype=torch.long))


def probe(model: nn.Module, example_ids: torch.Tensor) -> ModelLayout:
    """Run ``model(example_ids)`` once (no grad) and read its layout."""
    blocks_path, blocks = find_blocks(model)
    recorder = _LayoutRecorder(model, blocks)
    recorder.run(model, example_ids)
    if recorder.stream is None:
        raise UserError(f"{type(model).__name__}.forward never called its blocks ({blocks_path})",
                        "forward() must run the blocks of the nn.ModuleList in order")
    return ModelLayout(blocks_path=blocks_path, num_blocks=len(blocks),
                       pre=_read_in("pre", recorder.mode.used, blocks_path),
                       post=_read_in("post", recorder.mode.used, blocks_path),
                       roles=dict(sorted(recorder.roles.items())), index_ndim=recorder.index_ndim,
                       stream_shaped=frozenset(recorder.stream_shaped),
                       head_weights=frozenset(recorder.mode.head_weights), vocab=recorder.vocab,
                       block_params={i: tuple(n for n, _ in block.named_parameters())
                                     for i, block in enumerate(blocks)})


def _read_in(region: str, used: dict[str, set[str]], blocks_path: str) -> frozenset[str]:
    """Parameters outside the blocks that some torch function read in ``region`` (pre | post)."""
    return frozenset(name for name, regions in used.items()
                     if not name.startswith(blocks_path + ".") and region in regions)


class _LayoutRecorder:
    """The forward hooks ``probe`` installs, and what they record while the model runs once.

    A block's pre-hook enters the ``block`` region (forgetting the previous block's labels), the
    last block's post-hook enters ``post``.  Linear hooks pair each Linear with the Linears of
    its block that feed it (row-parallel after column-parallel); a Linear left unpaired when its
    block ends is replicated.  Embedding hooks record the index rank and the vocabulary; every
    module's post-hook notes an output shaped like the residual stream.
    """

    def __init__(self, model: nn.Module, blocks: nn.ModuleList | nn.Sequential) -> None:
        self.blocks = blocks
        self.block_ids = {id(b): i for i, b in enumerate(blocks)}
        self.mode = _Labels({id(p): n for n, p in model.named_parameters()})
        self.roles: dict[str, str] = {}
        self.open_linears: set[str] = set()        # Linears of this block awaiting their row-parallel pair
        self.index_ndim: dict[str, int] = {}
        self.stream_shaped: set[str] = set()
        self.stream: tuple[int, ...] | None = None  # shape of the first block's first argument
        self.vocab = 0

    def run(self, model: nn.Module, example_ids: torch.Tensor) -> None:
        """One no-grad forward under the labelling mode, with every hook installed."""
        handles = self._install(model)
        try:
            with torch.no_grad(), self.mode:
                model(example_ids)
        finally:
            for h in handles:
                h.remove()

    def _install(self, model: nn.Module) -> list[RemovableHandle]:
        handles = []
        for block in self.blocks:
            handles.append(block.register_forward_pre_hook(self.block_pre))
            handles.append(block.register_forward_hook(self.block_post))
        for name, module in dict(model.named_modules()).items():
            if isinstance(module, nn.Linear):
                handles.append(module.register_forward_pre_hook(self.linear_pre(name)))
                handles.append(module.register_forward_hook(self.linear_post(name)))
            elif isinstance(module, nn.Embedding):
                handles.append(module.register_forward_pre_hook(self.embedding_pre(name)))
            handles.append(module.register_forward_hook(self.any_post(name)))
        return handles

    def block_pre(self, module: nn.Module, args: tuple) -> None:
        self.mode.region = "block"
        self.mode.labels.clear()
        self.mode.alive.clear()
        self.open_linears.clear()
        if self.stream is None and args and isinstance(args[0], torch.Tensor):
            self.stream = tuple(args[0].shape)

    def block_post(self, module: nn.Module, args: tuple, output: object) -> None:
        for name in self.open_linears:                # first of a pair that never met its second
            self.roles[name] = REPLICATE
        self.open_linears.clear()
        if self.block_ids[id(module)] == len(self.blocks) - 1:
            self.mode.region = "post"

    def linear_pre(self, name: str) -> Callable[[nn.Module, tuple], None]:
        def hook(module: nn.Module, args: tuple) -> None:
            if self.mode.region != "block":
                self.roles[name] = COLWISE if self.mode.region == "post" else REPLICATE
                return
            feeding = {n for n in self.mode.labels_of(args) if n in self.open_linears}
            if feeding:
                self.roles[name] = ROWWISE
                for n in feeding:
                    self.roles[n] = COLWISE
                    self.open_linears.discard(n)
            else:
                self.open_linears.add(name)
        return hook

    def linear_post(self, name: str) -> Callable[[nn.Module, tuple, object], None]:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            if self.mode.region == "block" and isinstance(output, torch.Tensor):
                self.mode.label(output, frozenset({name}))
        return hook

    def embedding_pre(self, name: str) -> Callable[[nn.Module, tuple], None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self.roles[name] = EMBEDDING
            self.index_ndim[name] = args[0].dim()
            if not self.vocab and self.mode.region == "pre":
                self.vocab = module.num_embeddings  # type: ignore[assignment]  # an nn.Embedding's int
        return hook

    def any_post(self, name: str) -> Callable[[nn.Module, tuple, object], None]:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            if isinstance(output, torch.Tensor) and tuple(output.shape) == self.stream:
                self.stream_shaped.add(name)
        return hook


def count_blocks(model: str, timeout_s: float | None = None) -> int:
    """Blocks of ``model`` (zoo name, spec or model.py): from its config, else built on the meta device
    (the import and build within ``timeout_s``, ``time_limit``; None: the tracer's default)."""
    from autoplan.frontend.source import build_on_meta, load_source
    from autoplan.frontend.tracing import time_limit

    with time_limit(model, *(() if timeout_s is None else (timeout_s,))):
        source = load_source(model)
        if source.info is not None:
            return source.info.layers
        module = build_on_meta(source)          # a failure or a non-module: UserError
    return len(find_blocks(module)[1])
