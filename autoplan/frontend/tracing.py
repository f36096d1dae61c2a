"""``trace(model)``: a model → ``BlockGraph`` (pre, unique blocks × count, post).

Steps (nothing real is ever allocated):

1. resolve the model (``source``) and build it under the meta device;
2. find the layer stack and its block kinds by structure (``blocks``);
3. re-dress weights as fake CPU tensors (``fakes``);
4. for the run's (batch, seq) and a second size (``dims.alt_sizes``): one
   fake forward pass captures each kind's call (``regions.capture``), then
   the pre region, one block per kind and the post region are each traced
   forward+backward (``joint``);
5. MoE zoo/spec models: MoE blocks once more with 2× experts (expert dims);
6. sharding strategies from DTensor (``dtensor_strategies``) and conversion
   to the IR (``convert``).

Tracing cost is one block per kind, so it is nearly flat in depth.
"""
from __future__ import annotations

import logging
import resource
import signal
import sys
import threading
import time
from contextlib import contextmanager, redirect_stdout
from dataclasses import replace

from torch import nn

from autoplan.errors import UserError, raised_by_code
from autoplan.frontend import cache
from autoplan.frontend.blocks import LayerStack, find_layer_stack
from autoplan.frontend.convert import RoleSource, strategy_placeholder_names, to_opgraph
from autoplan.frontend.dims import alt_sizes
from autoplan.frontend.dtensor_strategies import enumerate_strategies
from autoplan.frontend.fakes import TORCH_DTYPES, fakeify_module, new_fake_mode
from autoplan.frontend.gpu_kernels import GpuKernels
from autoplan.frontend.hf import training_kernels
from autoplan.frontend.info import expert_modules, infer_model_info
from autoplan.frontend.inputs import ModelInputs, as_model_inputs, block_positions, default_inputs, takes_tokens
from autoplan.frontend.joint import TracedRegion, trace_joint
from autoplan.frontend.regions import block_region, capture, post_region, pre_region
from autoplan.frontend.source import ModelSource, build_on_meta, load_source, user_frame
from autoplan.gc_pause import cyclic_gc_paused
from autoplan.ir import Block, BlockGraph, ModelInfo, OpGraph

DTYPES = tuple(TORCH_DTYPES)
DEFAULT_TRACE_TIMEOUT_S = 300.0
"""Seconds the import, build and trace of a model may take unless the caller says otherwise."""

_DATA_DEPENDENT = ("DataDependentOutputException", "GuardOnDataDependentSymNode",
                   "DynamicOutputShapeException", "UnsupportedOperatorException")

log = logging.getLogger(__name__)


def trace(model: str, *, seq: int = 2048, batch: int = 1, dtype: str = "bf16",
          timeout_s: float = DEFAULT_TRACE_TIMEOUT_S) -> BlockGraph:
    """Trace ``model`` (model.py path, zoo name or family spec) into a BlockGraph.

    ``seq``: sequence length; ``batch``: micro-batch; ``dtype``: bf16 | fp16 | fp32;
    ``timeout_s``: how long the import, build and trace may take (``time_limit``).
    Results are cached on disk (see ``autoplan.frontend.cache``).
    """
    return trace_with_status(model, seq=seq, batch=batch, dtype=dtype, timeout_s=timeout_s)[0]


def trace_with_status(model: str, *, seq: int = 2048, batch: int = 1, dtype: str = "bf16",
                      use_cache: bool = True, timeout_s: float = DEFAULT_TRACE_TIMEOUT_S) -> tuple[BlockGraph, bool]:
    """``trace`` that also says whether the graph came from the cache."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}", f"use one of: {', '.join(DTYPES)}")
    if seq < 2 or batch < 1:
        raise UserError(f"bad run size seq={seq}, batch={batch}", "use seq >= 2 and batch >= 1")
    with time_limit(model, timeout_s):
        return _trace_cached(model, seq, batch, dtype, use_cache)


def _named(graph: BlockGraph, source: ModelSource) -> BlockGraph:
    """A cached graph under the name it is asked for: the key is the model's architecture, so a zoo
    name and the family spec of the same config share an entry, traced under either name."""
    notes = source.info.notes if source.info is not None else graph.model.notes
    return replace(graph, model=replace(graph.model, name=source.name, notes=notes))


def _trace_cached(model: str, seq: int, batch: int, dtype: str, use_cache: bool) -> tuple[BlockGraph, bool]:
    source = load_source(model, seq)
    if source.max_seq and seq > source.max_seq:
        raise UserError(f"{source.name} has {source.max_seq} learned positions, --seq {seq} is longer",
                        f"use --seq <= {source.max_seq}, or a gpt spec with max_seq={seq}")
    key = cache.cache_key(source.fingerprint, seq, batch, dtype, model_path=source.path)
    cached = cache.load(key) if use_cache else None
    if cached is not None:
        log.info("%s at seq %d: traced graph from the cache (%s)", source.name, seq, key[:12])
        return _named(cached, source), True
    log.info("%s at seq %d: tracing (%s)", source.name, seq, "cache off" if not use_cache else "not cached")
    start = time.perf_counter()
    with cyclic_gc_paused():
        graph = trace_source(source, seq=seq, batch=batch, dtype=dtype)
    graph = replace(graph, trace_seconds=round(time.perf_counter() - start, 3),
                    trace_peak_rss_bytes=peak_rss_bytes())
    cache.store(key, graph)
    log.info("%s: %d block kinds, %d layers traced in %.1f s", source.name, len(graph.blocks), graph.num_layers,
             graph.trace_seconds)
    return graph, False


class _TraceTimeout(BaseException):
    """Raised by SIGALRM inside the model's code; a BaseException so that the frontend's
    ``except Exception`` wrappers (and the model's own) do not swallow it."""


@contextmanager
def time_limit(model: str, limit: float = DEFAULT_TRACE_TIMEOUT_S):
    """Stop the import, build and trace of ``model`` after ``limit`` seconds (the CLI's
    ``--trace-timeout``; 0 or less: no limit; SIGALRM: only in the main thread, and only where no
    other alarm is set); a model calling ``sys.exit`` is bad input too.  What the model's code
    prints goes to stderr: stdout carries the command's own output (``trace --json``)."""
    armed = (limit > 0 and threading.current_thread() is threading.main_thread()
             and signal.getitimer(signal.ITIMER_REAL)[0] == 0)

    def on_alarm(signum, frame):
        raise _TraceTimeout

    old = signal.signal(signal.SIGALRM, on_alarm) if armed else None
    if armed:
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with redirect_stdout(sys.stderr):
            yield
    except _TraceTimeout:
        raise UserError(f"{model}: importing, building or tracing the model took more than {limit:g} s",
                        "make build_model() and the model file's import finish (no loops waiting on "
                        "input, no downloads), or raise --trace-timeout") from None
    except SystemExit as e:
        raise UserError(f"{model}: the model called sys.exit({e.code!r}) while being built or traced",
                        "remove the exit from the model file; raise an exception instead") from None
    except KeyboardInterrupt:
        if not raised_by_code():
            raise                                       # the user's Ctrl-C: exit 130
        raise UserError(f"{model}: the model raised KeyboardInterrupt while being imported, built or traced "
                        "(no interrupt was sent)",
                        "remove the raise from the model file; raise an ordinary exception instead") from None
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- the work ---------------------------------------------------------------------

def _run_error(e: Exception, source: ModelSource, what: str) -> UserError:
    where = user_frame(e, source.path)
    at = f" at {where}" if where else ""
    if type(e).__name__ in _DATA_DEPENDENT:
        op = getattr(e, "func", None)
        op_text = f" ({op})" if op is not None else ""
        return UserError(f"{source.name}: data-dependent control flow{at}: the model needs a tensor's "
                         f"value{op_text}, which tracing on fake tensors cannot know",
                         "avoid Python branching on tensor values (e.g. `if x.sum() > 0:`); "
                         "use torch.where or compute the condition from shapes")
    fix = "fix the model so that a forward+backward pass runs on these inputs"
    if source.example_inputs is None and source.kind == "file":
        fix = ("define example_inputs(batch, seq) in the model file, returning what forward takes (a tensor, a "
               "tuple of them or a dict of keyword arguments; autoplan passed token ids [batch, seq]), or " + fix)
    return UserError(f"{source.name}: {what} failed{at}: {type(e).__name__}: {e}", fix)


def _example_inputs(source: ModelSource, model: nn.Module, info: ModelInfo, sizes: tuple[int, int],
                    mode) -> ModelInputs:
    batch, seq = sizes
    with mode:
        if source.example_inputs is None:
            return default_inputs(model, info.vocab, batch, seq)
        try:
            value = source.example_inputs(batch, seq)
        except Exception as e:  # noqa: BLE001
            raise _run_error(e, source, "example_inputs()") from None
    return as_model_inputs(value, mode)


def _trace_regions(model: nn.Module, stack: LayerStack | None, source: ModelSource, info: ModelInfo,
                   mode, sizes: tuple[int, int], kinds: tuple[str, ...] | None = None,
                   ) -> dict[str, TracedRegion]:
    """Trace pre, one block per kind (or only ``kinds``) and post at (batch, seq) = ``sizes``."""
    inputs = _example_inputs(source, model, info, sizes, mode)
    try:
        with mode, GpuKernels(), training_kernels():
            cap = capture(model, stack, inputs)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _run_error(e, source, "the forward pass") from None
    _check_output(cap.logits_shape, sizes, source)
    regions = []
    if stack is not None:
        if kinds is None:
            regions.append(pre_region(model, stack, cap))
        regions += [block_region(stack, k, cap) for k in (kinds or stack.unique_kinds())]
    if kinds is None:
        regions.append(post_region(model, stack, cap))
    traced = {}
    for region in regions:
        try:
            traced[region.name] = trace_joint(region, mode)
        except Exception as e:  # noqa: BLE001
            raise _run_error(e, source, f"tracing forward+backward of {region.name}") from None
    return traced


def _check_output(logits_shape: tuple[int, ...] | None, sizes: tuple[int, int], source: ModelSource) -> None:
    """The model's output is a scalar loss, logits shaped (batch, seq, vocab) or (batch·seq, vocab),
    or — for a model with its own ``example_inputs`` (images, features) — any per-sample or
    per-position prediction (a classifier's (batch, classes))."""
    if logits_shape is None:
        return
    batch, seq = sizes
    if source.example_inputs is not None and len(logits_shape) >= 2 and logits_shape[-1] >= 2:
        return          # its own inputs: positions and units are the model's (frontend.info reads them)
    if tuple(logits_shape[:-1]) in ((batch, seq), (batch * seq,)) and logits_shape[-1] >= 2:
        return
    raise UserError(f"{source.name}: the model returned a tensor of shape {list(logits_shape)}, which is "
                    f"neither a scalar loss nor logits of shape [{batch}, {seq}, vocab] for input "
                    f"tokens [{batch}, {seq}]",
                    "return the logits (or an object with .logits / .loss, or a 0-d loss tensor) from forward()")


def _no_stack_note(model: nn.Module) -> str:
    """What a model without a stack of repeated blocks is made of (it traces as pre + post only;
    ``Workload.load`` refuses to plan it, naming what was found)."""
    children = [f"{name} ({type(m).__name__})" for name, m in model.named_children()][:8]
    found = ", ".join(children) if children else "no submodules"
    return (f"no repeated block found (top-level modules: {found}): estimate, search and explain "
            "need a stack of identical layers; build the model around an nn.ModuleList of them")


def _describe(graph: OpGraph, kind: str, info: ModelInfo) -> str:
    ops = {n.op.split(".")[1] if n.op.count(".") >= 2 else n.op for n in graph.ops()}
    if "_scaled_dot_product_flash_attention" in ops:
        attention = "flash attention"
    elif "_scaled_dot_product_efficient_attention" in ops:
        attention = "efficient attention"
    elif "_softmax" in ops and ops & {"bmm", "baddbmm"}:
        attention = "eager attention"
    else:
        attention = "no attention"
    window = max((n.attention_window for n in graph.ops()), default=0)
    if window:
        attention += f" (window {window:,})"
    if kind.startswith("moe"):
        shared = f" + {info.shared_experts} shared" if info.shared_experts else ""
        mlp = f"MoE ({info.experts} experts, top-{info.topk}{shared})" if info.experts else "MoE"
    elif "silu" in ops:
        mlp = "SwiGLU MLP"
    elif "gelu" in ops or "tanh" in ops:
        mlp = "GeLU MLP"
    elif "relu" in ops:
        mlp = "ReLU MLP"
    else:
        mlp = "MLP"
    return f"{attention} + {mlp}"


def _outside_expert_modules(model: nn.Module, stack: LayerStack | None, experts: int) -> tuple[str, ...]:
    """Expert modules outside the layer stack (a multi-token-prediction module's MoE layer runs in
    ``post``), by path from the model: their expert dims by the size heuristic (``dims``)."""
    inside = stack.paths if stack is not None else ()
    return tuple(p for p in expert_modules(model, experts)
                 if not any(p == q or p.startswith(q + ".") for q in inside))


def _repeats(stack: LayerStack | None) -> tuple[nn.Module, ...]:
    """Layers after the first of their kind: the capture pass never runs them."""
    if stack is None:
        return ()
    return tuple(layer for i, (layer, kind) in enumerate(zip(stack.layers, stack.kinds))
                 if i != stack.first_index(kind))


def _training_mode(model: nn.Module) -> nn.Module:
    """Train mode (dropout on) and, for transformers models, no KV cache (in every submodule's
    config: an encoder-decoder's stacks hold their own copies)."""
    model.train()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", False):
            config.use_cache = False
    return model


def _input_facts(source: ModelSource, model: nn.Module, stack: LayerStack | None, info: ModelInfo,
                 mode, main: dict[str, TracedRegion], sizes: tuple[int, int]) -> dict:
    """ModelInfo fields on the inputs: token ids or not, the throughput unit, positions per sample."""
    tokens = takes_tokens(_example_inputs(source, model, info, sizes, mode), *sizes)
    first = main[stack.kinds[0]].region.inputs if stack is not None else []
    return {"token_inputs": tokens, "throughput_unit": "tokens" if tokens else "samples",
            "positions": block_positions(first, sizes[1], tokens)}


def trace_source(source: ModelSource, *, seq: int, batch: int, dtype: str) -> BlockGraph:
    """Trace a resolved source (no cache)."""
    model = _training_mode(build_on_meta(source))
    stack = find_layer_stack(model)
    info = source.info or infer_model_info(source.name, model, stack)
    mode = new_fake_mode()
    fakeify_module(model, mode, TORCH_DTYPES[dtype], skip=_repeats(stack))
    sizes, sizes2 = (batch, seq), alt_sizes(batch, seq)
    main = _trace_regions(model, stack, source, info, mode, sizes)
    alt = _trace_regions(model, stack, source, info, mode, sizes2)

    experts_alt: dict[str, TracedRegion] = {}
    moe_kinds = tuple(k for k in (stack.unique_kinds() if stack else ()) if k.startswith("moe"))
    if source.with_experts is not None and info.experts and moe_kinds:
        model2 = _training_mode(build_on_meta(source, source.with_experts(2 * info.experts)))
        stack2 = find_layer_stack(model2)
        fakeify_module(model2, mode, TORCH_DTYPES[dtype], skip=_repeats(stack2))
        by_position = dict(zip(stack2.unique_kinds(), stack.unique_kinds()))  # type: ignore[union-attr]  # moe_kinds
        traced2 = _trace_regions(model2, stack2, source, info, mode, sizes,
                                 kinds=tuple(k2 for k2, k in by_position.items() if k in moe_kinds))
        experts_alt = {by_position[k2]: tr for k2, tr in traced2.items()}

    notes = list(info.notes) + ([_no_stack_note(model)] if stack is None else [])
    fallbacks: set[str] = set()

    def convert(name: str) -> OpGraph:
        tr = main[name]
        table = enumerate_strategies(tr.gm, strategy_placeholder_names(tr))
        fallbacks.update(table.fallbacks)
        layer = stack.layers[stack.first_index(name)] if stack is not None and name in stack.kinds else None
        roles = RoleSource(sizes=sizes, alt=alt.get(name), alt_sizes=sizes2,
                           experts_alt=experts_alt.get(name), expert_count=info.experts,
                           expert_modules=(expert_modules(layer, info.experts) if layer is not None
                                           else _outside_expert_modules(model, stack, info.experts)))
        converted = to_opgraph(tr, table, roles, seq_len=seq, dtype=dtype, batch=batch)
        if converted.guessed_nodes:
            notes.append(f"{name}: dim roles of {converted.guessed_nodes} node(s) guessed from sizes "
                         "(no counterpart in the second trace)")
        return converted.graph

    pre = convert("pre") if "pre" in main else OpGraph(nodes=(), seq_len=seq, dtype=dtype, batch=batch)
    post = convert("post")
    blocks = []
    for kind in (stack.unique_kinds() if stack else ()):
        graph = convert(kind)
        paths = tuple(p for p, k in zip(stack.paths, stack.kinds) if k == kind)  # type: ignore[union-attr]  # kinds
        blocks.append(Block(kind=kind, graph=graph, count=len(paths), module_paths=paths,
                            description=_describe(graph, kind, info)))
    if fallbacks:
        notes.append("strategies fell back to replicate/pointwise for: " + ", ".join(sorted(fallbacks)))
    shared = {n.param for n in pre.params()} & {n.param for n in post.params()}
    info = replace(info, notes=tuple(notes), tied_embeddings=info.tied_embeddings or bool(shared),
                   **_input_facts(source, model, stack, info, mode, main, sizes))
    return BlockGraph(model=info, blocks=tuple(blocks), order=stack.kinds if stack else (), pre=pre,
                      post=post, seq_len=seq, dtype=dtype, batch=batch)
