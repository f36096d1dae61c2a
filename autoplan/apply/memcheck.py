"""The runtime reference for the memory model: a plan applied by ``autoplan.apply`` on fake
tensors at its full world size, two training steps under torch's memory tracker.

For one rank of every *rank kind* (each pipeline rank; every other coordinate gives the same
bytes; ``measured_pp_ranks`` picks five of a deep pipeline), in a fresh process: torch's fake
process group (``FakeStore``) at the plan's world
size and that rank; the model built on the meta device and re-dressed as fake fp32 CPU tensors
(``frontend.fakes``), so nothing is allocated; ``apply`` with ``mixed_precision`` (FSDP2 with
torchtitan's policy: fp32 sharded parameters, bf16 compute, fp32 reduction); then two steps
(forward + backward of every micro-batch, AdamW step, ``zero_grad``) under
``torch.distributed._tools``' ``MemTracker`` (``FSDPMemTracker`` refuses a module run more than once).  The peak
snapshot's categories map to the estimator's:

==========  ================================================================
params      sharded and unsharded parameters, buffers
grads       sharded and unsharded gradients
optimizer   optimizer state
activations activations and inputs
other       temporaries, all-gather and reduce-scatter buffers, the rest
==========  ================================================================

The model's attention and dropout run as the GPU kernels the tracer records (``gpu_functionals``:
FlashAttention with in-kernel dropout, ``native_dropout``), its RMSNorms as the fused kernel.

Layers of one kind are identical, so a rank's peak is affine in its layer count (the states of
each layer, its saved activations and its transients repeat; the peak moment, the loss backward
of the last micro-batch, is the same place).  ``measure`` therefore runs the model cut to
``k`` and ``k + 1`` layers (``k`` = the leading dense layers + 3, so that both cuts have a first,
a middle and a last block: with k = 2 the 2-layer cut has no middle block, and a MoE FSDP
plan's step peak fell at another place in it than in the deeper cuts, read 12.59 GiB where the
whole 8-layer model holds 11.02) and extrapolates every category to the model's own count (when L > 2k + 1;
shallower models run whole, which is cheaper):
``M(L) = M(k + 1) + (L − k − 1)·(M(k + 1) − M(k))``.  Exact for zoo and family-spec models (their
configs say the layer count); a ``model.py`` runs whole.  Profiling the whole-model run
(llama3-8b ``tp=2,dp=4``, 15 min before): the time is the fake process group's all-gathers and
FSDP2's ``split_with_sizes_copy`` copy-out, which move real bytes (FSDP's all-gather buffers are
ordinary CPU tensors; only the parameters are fake), per layer per micro-batch per step.

Pipeline parallelism (gpipe, 1f1b, interleaved, and the split-backward zb-h1, zbv, zb-h2) runs
one pipeline rank's own step, with no point-to-point traffic: its stages built by ``apply`` (the
plan's stage split, DTensor TP/SP, FSDP2, recompute), then its forwards and (full, or input and
weight) backwards in the order of torch's schedule for the plan (``schedule.pipeline_order``), stage
inputs and output gradients fresh fake tensors
(``memcheck_pipeline``).  torch's runtime itself cannot run under the fake process group:
``PipelineStage`` without static ``input_args``/``output_args`` learns the shapes it receives by
``recv_object_list`` from its peer, which the fake process group never sends; with static
shapes the schedule still votes STATIC vs DYNAMIC over P2P (its private ``_warmup_p2p``), reading
zeros; and ``MemTracker`` refuses a module run more than once (``experiments/RESULTS.md``).  A
rank's stages run whole (L/pp layers; no layer extrapolation), the optimizer state comes from an
untracked optimizer step on zero gradients and one step is tracked; under FSDP inside the fake
mode (FSDP's all-gather buffers, ordinary CPU tensors outside it, are then fake: 0.8 GB per
llama3-405b layer at tp=8, per rank kind, in RAM otherwise), else outside it (``_pipeline_child``).

Reserved memory (``measure(reserved=True)``, ``autoplan memcheck --allocator``): the tracker sees
every storage the run creates, resizes and frees, in program order and with the stream current
at the time (``record_requests``); those requests replayed through torch's CUDA caching
allocator (``costmodels.allocator``, classic and with expandable segments) give the reserved
peak trainers log (``torch.cuda.max_memory_reserved``).  The model then runs whole: the holes a
layer leaves depend on every request before it, so a cut model's reserved bytes do not
extrapolate.  Not in the requests: what a CUDA kernel allocates for itself (cuBLAS workspaces)
and what NCCL allocates outside the caching allocator.

Zero 0/1 runs Megatron-Core's engine (``apply.distributed_optimizer``: bf16 parameters, a
persistent fp32 gradient buffer, fp32 master weights and Adam moments of the rank's 1/d range
under the distributed optimizer), whose buffers and masters ``track_model_states`` registers as
gradients and optimizer state.

Context parallelism runs on the rank's two sequence chunks (s/cp tokens; ring and Ulysses
exchanges move fake tensors like any collective), except under FSDP (zero 2/3 at dp > 1): apply
shards FSDP over the dp axis alone, where the estimate prices torchtitan's cp·dp sharding.

FP8 plans are not measured (``unsupported``, with ``apply.parallel.precision_refusal``'s reason):
torch 2.13's fake mode does hold ``float8_e4m3fn`` tensors and runs ``torch._scaled_mm`` on them
(and torchao's tensorwise float8 linears train on CPU), but ``apply`` builds bf16 linears only, so
the tracker would measure the bf16 twin, not Transformer Engine's FP8 inputs and weight copies
(``cost.fp8``).

Expert parallelism runs for the zoo's MoE, whose experts take a capacity buffer [E, C, h] and
exchange it with equal-split all-to-alls (``apply.expert_parallel``): no shape depends on token
values.  What it does not run: expert parallelism on a ``model.py`` whose experts route dropless
(the all-to-all's split sizes are token counts, which fake tensors do not have), cp under FSDP,
DualPipeV (its overlapped forward-backward pairs) and the MoE parallel folding apply does not build
(``apply.parallel.check_folding``; etp=1 and etp=tp run, on the expert layout's mesh).
``unsupported`` names the first of these a plan uses.
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import sys

from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import SCHEDULE_SPECS, Plan

GIB = 1024 ** 3
CATEGORIES = {
    "params": ("Parameter", "Buffer", "Sharded Param", "Unsharded Param"),
    "grads": ("Gradient", "Sharded Grad", "Unsharded Grad"),
    "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation", "Inputs"),
}
STEPS = 2
ALLOCATORS = {"classic": False, "expandable": True}     # name → expandable segments (costmodels.allocator)
_BLOCK = re.compile(r"\.layers\.(\d+)")      # a block's index in a module name


# F, B, I, W actions (memcheck_pipeline): every schedule but those of overlapped forward-backward pairs
PIPELINE_SCHEDULES = tuple(n for n, spec in SCHEDULE_SPECS.items() if not spec.overlapped_pairs)


def unsupported(plan: Plan, model: str | None = None) -> str | None:
    """Why memcheck cannot measure ``plan`` of ``model`` (see the module docstring), or None."""
    if plan.precision != "bf16":
        from autoplan.apply.parallel import precision_refusal

        return precision_refusal(plan)[0]
    if plan.cp > 1 and plan.dp > 1 and plan.zero >= 2:
        return (f"cp={plan.cp} with zero={plan.zero}: apply's FSDP shards over the dp axis alone, the estimate "
                "(torchtitan's dp_shard_cp mesh) over cp·dp")
    if plan.ep > 1 and (model is None or _config(model, 0) is None):
        return (f"ep={plan.ep} on a model.py: its experts' dropless routing sizes the all-to-all by token "
                "values, which fake tensors do not have (the zoo's capacity-buffer MoE runs)")
    from autoplan.apply.parallel import check_folding, recompute_refusal

    if plan.folded:
        try:
            check_folding(plan)
        except UserError as e:
            return e.problem
    if plan.pp > 1 and (refusal := recompute_refusal(plan)):
        return refusal
    if plan.pp > 1 and plan.schedule not in PIPELINE_SCHEDULES:
        return (f"schedule={plan.schedule}: memcheck runs a pipeline rank's forwards and (split) backwards "
                f"({', '.join(PIPELINE_SCHEDULES)}), not DualPipeV's overlapped forward-backward pairs")
    return None


def rank_kinds(plan: Plan) -> list[int]:
    """One global rank per pipeline rank: pp coordinate r, every other coordinate 0."""
    mesh = Mesh.of(plan)
    return [next(g for g in range(plan.num_gpus) if mesh.coords(g)["pp"] == r
                 and all(c == 0 for a, c in mesh.coords(g).items() if a != "pp")) for r in range(plan.pp)]


def measured_pp_ranks(pp: int, highest: int) -> list[int]:
    """The pipeline ranks memcheck runs by default: all of them up to pp = 4, else the first,
    the second, the one the estimate puts highest (``highest``), the middle one and the last
    (each pipeline rank takes minutes at full scale)."""
    return list(range(pp)) if pp <= 4 else sorted({0, 1, highest, pp // 2, pp - 1})


def layer_counts(model: str, seq: int = 0) -> tuple[int, int, int] | None:
    """(k, k + 1, L) for the layer extrapolation of ``measure``, or None when the model runs whole
    (a ``model.py``, or a model too shallow to gain from it)."""
    cfg = _config(model, seq)
    if cfg is None:
        return None
    k = getattr(cfg, "dense_layers", 0) + 3     # both cuts have a first, a middle and a last block
    return (k, k + 1, cfg.layers) if cfg.layers > 2 * k + 1 else None   # else the whole model is cheaper


def _config(model: str, seq: int, layers: int | None = None):
    """The zoo or family-spec config of ``model`` (with ``layers`` layers), or None for a file."""
    from dataclasses import replace

    from autoplan import zoo
    from autoplan.zoo.spec import is_spec, parse_spec

    cfg = parse_spec(model, seq) if is_spec(model) else zoo.ZOO.get(model)
    return cfg if cfg is None or layers is None else replace(cfg, layers=layers)


def measure(model: str, plan: Plan, *, seq: int, global_batch: int, rank: int, reserved: bool = False,
            hbm_bytes: int | None = None, placements: dict[str, str] | None = None, timeout_s: float = 1800) -> dict:
    """Peak bytes by category of ``rank``, extrapolated from two cut models when the model's
    layers allow (``layer_counts``; see the module docstring).  Under pp > 1 the rank's stages
    run whole (a rank holds L/pp layers; the step is one rank's, ``memcheck_pipeline``), and the
    answer also carries ``in_flight``: the chunk-micro-batches torch's order holds at most.
    With ``reserved`` the model runs whole and the answer also carries ``reserved``: for each of
    ``ALLOCATORS``, the run's requests replayed through torch's CUDA caching allocator on a device
    of ``hbm_bytes`` (``replay_reserved``); a cut model does not do for this, as the holes a layer
    leaves depend on what came before it (llama3-8b FSDP8, expandable segments: 1.37 and 1.54 GiB
    more reserved from 2 to 3 and from 3 to 4 layers).  ``placements``: the tp placements to apply
    (a searched ``Layout``'s); None: apply's rule (``tensor_parallel.default_placement``)."""
    counts = layer_counts(model, seq)
    if counts is None or plan.pp > 1 or reserved:
        out = _measure(model, plan, seq=seq, global_batch=global_batch, rank=rank, layers=None, timeout_s=timeout_s,
                       reserved=reserved, hbm_bytes=hbm_bytes, placements=placements)
        extra = {key: out[key] for key in ("in_flight", "reserved") if key in out}
        return {**out["peak"], **extra}
    k, k1, total = counts
    a, b = (_measure(model, plan, seq=seq, global_batch=global_batch, rank=rank, layers=n, timeout_s=timeout_s,
                     placements=placements) for n in (k, k1))
    return extrapolate(a, b, total - k1)


def extrapolate(a: dict, b: dict, extra: int) -> dict[str, float]:
    """The highest of the moments common to both cuts, each moved ``extra`` layers on:
    ``b + extra·(b − a)`` per category (a moment's bytes are affine in the layer count)."""
    moved = [{cat: b[m][cat] + extra * (b[m][cat] - a[m][cat]) for cat in b[m]} for m in sorted(a.keys() & b.keys())]
    return max(moved, key=lambda d: d["total"])


def _measure(model: str, plan: Plan, *, seq: int, global_batch: int, rank: int, layers: int | None,
             timeout_s: float, reserved: bool = False, hbm_bytes: int | None = None,
             placements: dict[str, str] | None = None) -> dict:
    """One child process's peak by category (``_child``)."""
    args = json.dumps({"model": model, "plan": plan.to_string(), "seq": seq, "global_batch": global_batch,
                       "rank": rank, "layers": layers, "reserved": reserved, "hbm_bytes": hbm_bytes,
                       "placements": placements})
    out = subprocess.run([sys.executable, "-m", "autoplan.apply.memcheck", args], capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        raise UserError(f"memcheck of rank {rank} failed: {tail}",
                        "run `autoplan run` on a small version of the model to see whether apply supports it")
    return json.loads(out.stdout.strip().splitlines()[-1])


def categorize(peak: dict) -> dict[str, float]:
    """The tracker's peak snapshot of one device → bytes per estimator category."""
    out = {k: 0.0 for k in (*CATEGORIES, "other")}
    for key, value in peak.items():
        name = getattr(key, "value", str(key))
        if name == "Total":
            continue
        cat = next((c for c, names in CATEGORIES.items() if name in names), "other")
        out[cat] += float(value)
    out["total"] = float(peak.get("Total", sum(out.values())))
    return out


def fuse_rms_norms(model):
    """Every ``nn.RMSNorm`` runs as the fused kernel a GPU run uses (``FusedRMSNorm``), as the
    tracer records it (``frontend.gpu_kernels``): on CPU, ``F.rms_norm`` decomposes and keeps an
    fp32 copy of its input and of its normalized output for backward (2·s·h·4 bytes per norm
    instead of the bf16 input and the fp32 rstd).  A class swap, so recomputation replays it."""
    from torch import nn

    for module in model.modules():
        if type(module) is nn.RMSNorm:
            module.__class__ = _fused_rms_norm_class()
    return model


@functools.lru_cache(maxsize=1)
def _fused_rms_norm_class():
    from torch import nn

    from autoplan.frontend.gpu_kernels import gpu_rms_norm

    class FusedRMSNorm(nn.RMSNorm):
        def forward(self, x):
            return gpu_rms_norm(x, self.normalized_shape, self.weight, self.eps)
    return FusedRMSNorm


@contextlib.contextmanager
def gpu_functionals():
    """``F.scaled_dot_product_attention`` and ``F.dropout`` run as the kernels a GPU run uses and
    the tracer records (``frontend.gpu_kernels``: FlashAttention-2 / memory-efficient attention,
    ``native_dropout``).  On CPU, SDPA with dropout (GPT's 0.1) falls back to the math path: fp32
    copies of q, k, v and the s×s scores, probabilities and dropout mask saved per layer (a GPU's
    flash kernel drops in-kernel and saves the output and the log-sum-exp); ``F.dropout`` saves a
    mask in the input's dtype (bf16: 2 B per element, GPU's ``native_dropout`` 1 B).  A swap of
    the module attributes, not ``GpuKernels``' TorchFunctionMode: the recomputation of a
    checkpointed layer in backward runs outside that mode and would replay the CPU kernels."""
    import torch.nn.functional as F

    from autoplan.frontend import gpu_kernels as gk

    def attention(*args, **kwargs):
        q, k, v, mask, p, causal, scale, _ = gk._sdpa_args(*args, **kwargs)
        return gk.gpu_attention(q, k, v, mask, p, causal, scale)

    def dropout(*args, **kwargs):
        return gk.gpu_dropout(*gk._dropout_args(*args, **kwargs))

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = attention, dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def register_fused_rms_norm_sharding() -> None:
    """DTensor sharding of ``autoplan::fused_rms_norm`` (the fused RMSNorm ``GpuKernels`` runs):
    replicated, or sharded on any dim but the normalized ones with the weight replicated — the
    rule DTensor has for ``aten._fused_rms_norm`` (outputs: the normalized tensor and rstd)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    import autoplan.frontend.gpu_kernels  # noqa: F401  (defines the op)

    @register_sharding(torch.ops.autoplan.fused_rms_norm.default)
    def _sharding(x, normalized_shape, weight, eps):
        w = None if weight is None else Replicate()
        out = [([Replicate(), Replicate()], [Replicate(), None, w, None])]
        for d in range(x.ndim - len(normalized_shape)):
            out.append(([Shard(d), Shard(d)], [Shard(d), None, w, None]))
        return out


def _child(spec: dict) -> dict:
    """Build, apply and run two steps on fake tensors for one rank; the peak by category."""
    from dataclasses import replace

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.apply.device_mesh import device_mesh
    from autoplan.apply.parallel import apply
    from autoplan.frontend.fakes import fakeify_module, new_fake_mode
    from autoplan.frontend.source import build_on_meta, load_source

    plan = Plan.parse(spec["plan"])
    register_fused_rms_norm_sharding()
    dist.init_process_group("fake", store=FakeStore(), rank=spec["rank"], world_size=plan.num_gpus)
    source = load_source(spec["model"], spec["seq"])
    if spec.get("layers"):
        from autoplan import zoo
        cfg = _config(spec["model"], spec["seq"], spec["layers"])
        source = replace(source, build=lambda: zoo.build(cfg))
    model = fuse_rms_norms(build_on_meta(source))
    mode = new_fake_mode()
    fakeify_module(model, mode, torch.float32)
    hidden = _hidden(model)
    pm = apply(model, plan, device_mesh(plan, "cpu"), global_batch=spec["global_batch"], seq=spec["seq"],
               placements=spec.get("placements"), mixed_precision=True)
    del model
    opt = pm.optimizer("adamw", 1e-3)
    with gpu_functionals():
        if plan.pp > 1:
            return _pipeline_child(pm, opt, mode, seq=spec["seq"], hidden=hidden, replay=_replayer(spec))
        return _flat_child(pm, opt, mode, batch=spec["global_batch"] // plan.dp, seq=spec["seq"],
                           replay=_replayer(spec))


def _replayer(spec: dict):
    """The child's replay of its requests under every allocator (``replay_reserved``), or None."""
    if not spec.get("reserved"):
        return None
    return lambda events: {name: replay_reserved(events, allocator=name, hbm_bytes=spec.get("hbm_bytes"))
                           for name in ALLOCATORS}


def replay_reserved(events: list, *, allocator: str, hbm_bytes: int | None) -> dict:
    """A run's allocator requests (``record_requests``) replayed through torch's CUDA caching
    allocator (``costmodels.allocator``): {allocator, allocated_peak, reserved_peak,
    reserved_at_allocated_peak, over_capacity, needs}, bytes; ``needs`` is the least device the
    run does not run out on (``least_capacity``)."""
    from costmodels.allocator import least_capacity, replay

    expandable = ALLOCATORS[allocator]
    free_run = replay(events, expandable=expandable)
    # a device that never fills behaves the same up to its capacity: replay again only past it
    fits = hbm_bytes is None or free_run.reserved_peak <= hbm_bytes
    out = free_run if fits else replay(events, expandable=expandable, capacity=hbm_bytes)
    return {"allocator": allocator, "allocated_peak": out.allocated_peak, "reserved_peak": out.reserved_peak,
            "reserved_at_allocated_peak": out.reserved_at_allocated_peak, "over_capacity": out.over_capacity,
            "needs": least_capacity(events, expandable=expandable, free_run=free_run)}


def _flat_child(pm, opt, mode, *, batch: int, seq: int, replay=None) -> dict:
    """pp = 1: two steps of ``batch`` sequences under the tracker; its aligned moments, and
    with ``replay`` (``replay_reserved``) the reserved bytes of the steps' requests."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    with mode:      # this rank's rows; under cp its two sequence chunks (ParallelModel.local_batch)
        ids = torch.zeros(batch, seq // pm.plan.cp, dtype=torch.long)
    tracker = MemTracker()      # FSDPMemTracker refuses a module run more than once (micro-batches, steps)
    events = record_requests(tracker) if replay else None
    track_model_states(tracker, pm, opt)
    with tracker:
        for _ in range(STEPS):
            pm.forward_backward(ids, ids, read_loss=False, before_microbatch=tracker.reset_mod_stats)
            opt.step()
            opt.zero_grad()
    out = moments(tracker)
    return {**out, "reserved": replay(events)} if replay else out


def track_model_states(tracker, pm, opt) -> None:
    """What ``tracker`` must know before the tracked steps: the stages' parameters and buffers and
    the optimizers' states (``track_external``); under Megatron's engine for zero 0/1
    (``apply.distributed_optimizer``) also its fp32 gradient buffers as gradients and its fp32
    master weights as optimizer state — ``track_external`` would count a bare tensor as "Other",
    so they get their category through the tracker's own ``_update_and_maybe_create_winfos``
    (private in torch 2.13), as its module hooks categorise parameters and gradients."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    parts = getattr(opt, "parts", [opt])
    inner = [getattr(o, "inner", o) for o in parts]
    tracker.track_external(*pm.stages, *[o for o in inner if o is not None])
    for grads in pm.gradient_buffers:
        for g in grads.tensors:
            tracker._update_and_maybe_create_winfos(g, _MemRefType.GRAD)
    for master in (m for o in parts for m in getattr(o, "masters", ())):
        tracker._update_and_maybe_create_winfos(master, _MemRefType.OPT)


def record_requests(tracker) -> list:
    """The allocator requests behind ``tracker``'s bookkeeping, in program order
    (``costmodels.allocator.Event``): a storage's first tracked size is an ``alloc``, its
    finalization a ``free``, a resize (FSDP2 frees and re-allocates unsharded parameters with
    ``UntypedStorage.resize_``, between 0 and full size) a ``free`` and an ``alloc`` (a resize
    between two nonzero sizes would allocate before it frees; FSDP2 makes none).  Each request is tagged with the
    stream current when it was made (``torch.cpu.current_stream()``: FSDP2 enters its
    all-gather and reduce-scatter streams with ``device_handle.stream`` on CPU as on CUDA), 0
    for the default stream.  Private torch 2.13 API: ``MemTracker._update_snap`` and its
    ``_UpdateType``, wrapped on this instance (test: ``test_record_requests_...``)."""
    import torch
    from torch.distributed._tools.mem_tracker import _UpdateType

    from costmodels.allocator import Event

    events: list[Event] = []
    keys: dict[int, int] = {}
    streams: dict[int, tuple[int, object]] = {id(torch.cpu.current_stream()): (0, torch.cpu.current_stream())}
    original = tracker._update_snap

    def alloc(winfo) -> None:
        current = torch.cpu.current_stream()
        stream = streams.setdefault(id(current), (len(streams), current))[0]
        keys[id(winfo)] = key = len(events)
        events.append(Event("alloc", key, winfo.mem_consumed, stream))

    def free(winfo) -> None:
        key = keys.pop(id(winfo), None)
        if key is not None:
            events.append(Event("free", key))

    def update(u_type, winfo, old_mem_consumed=None, old_reftype=None):
        original(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
        if u_type in (_UpdateType.DEL, _UpdateType.SIZE):
            free(winfo)
        if u_type in (_UpdateType.ADD, _UpdateType.SIZE) and winfo.mem_consumed > 0:
            alloc(winfo)

    tracker._update_snap = update
    return events


def _hidden(model) -> int:
    """The residual stream's width: the token embedding's row size (``nn.Embedding``)."""
    from torch import nn

    return next(m.embedding_dim for m in model.modules() if isinstance(m, nn.Embedding))


def _pipeline_child(pm, opt, mode, *, seq: int, hidden: int, replay=None) -> dict:
    """pp > 1: the optimizer state made by an untracked step on zero gradients (what a first step
    leaves), then one step of this pipeline rank in torch's order (``memcheck_pipeline``) under
    the tracker.  Under FSDP (zero ≥ 2 at dp > 1) the tracker is entered inside the fake mode, so
    that FSDP's all-gather buffers are fake too (outside it they are real CPU tensors: 0.8 GB per
    llama3-405b layer at tp=8); without FSDP outside it, as at pp = 1: entered inside, every
    view of a parameter made during the step (``to_local``, ``t()`` of a weight) reaches the
    tracker as a new storage (torch 2.13: 2 B per parameter of phantom activations on
    llama zero=1, pp=2, tp=2).  Returns the peak by category and the chunk-micro-batches
    torch's order holds at most."""
    import torch

    from autoplan.apply import memcheck_pipeline as mp

    plan = pm.plan
    fsdp = plan.dp > 1 and plan.zero >= 2
    with mode:
        for p in pm.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        ids = torch.zeros(plan.mbs, seq // plan.cp, dtype=torch.long)     # this rank's chunks under cp
    tracker = mp.step_tracker()
    events = record_requests(tracker) if replay else None
    track_model_states(tracker, pm, opt)
    local = seq // plan.cp
    stream = (plan.mbs, local // plan.tp if plan.sp and plan.tp > 1 else local, hidden)
    dtype = torch.bfloat16 if fsdp else next(iter(pm.parameters())).dtype
    with mode if fsdp else contextlib.nullcontext(), mp.dtensor_metadata_outside(mode), tracker:
        mp.run_step(pm, pm.coords["pp"], ids, stream, dtype)
        opt.step()
        opt.zero_grad()
    peak = categorize(max(tracker.get_tracker_snapshot("peak").values(), key=lambda d: d.get("Total", 0)))
    out = {"peak": peak, "in_flight": mp.peak_in_flight(mp.torch_order(pm.schedule, pm.coords["pp"]))}
    return {**out, "reserved": replay(events)} if replay else out


def _block_role(index: int, depth: int) -> str:
    """A block's name across cut depths: the first and the last align, middle ones do not."""
    return "first" if index == 0 else "last" if index == depth - 1 else f"middle{index}"


def moments(tracker) -> dict[str, dict[str, float]]:
    """The peak by category at each moment ``measure`` aligns across cut depths: ``"peak"``
    (the step's peak, wherever it falls) and every module's forward and backward peak of the
    last micro-batch, keyed by its name with a block's index replaced by its role
    (``layers.first``, ``layers.last``: the same moment in both cuts; middle blocks are dropped).
    Modules that enclose the block stack (the stage, the model) are dropped too: their peak is
    the highest of their blocks', at a block that moves with the depth (llama3-70b tp=8: the
    second layer's backward of the 3-layer cut, holding two layers' unsharded gradients, against
    the first's of the 2-layer cut), so it is not one moment."""
    def one(snap: dict) -> dict[str, float]:
        return categorize(max(snap.values(), key=lambda d: d.get("Total", 0)))

    out = {"peak": one(tracker.get_tracker_snapshot("peak"))}
    stats = list(tracker.memory_tracking.values())
    depth = 1 + max((int(m.group(1)) for st in stats for m in [_BLOCK.search(st.mod_fqn)] if m), default=-1)
    enclosing = {st.mod_fqn[:m.start()].rsplit(".", k)[0] for st in stats for m in [_BLOCK.search(st.mod_fqn)] if m
                 for k in range(st.mod_fqn[:m.start()].count(".") + 1)}
    for st in stats:
        if st.mod_fqn in enclosing:
            continue
        name = _BLOCK.sub(lambda m: ".layers." + _block_role(int(m.group(1)), depth), st.mod_fqn)
        for state, snaps in st.snapshots.items():
            if snaps and getattr(state, "name", "").startswith("PEAK"):
                out[f"{name}:{state.name}"] = one(snaps[-1])
    return out


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    print(json.dumps(_child(json.loads(sys.argv[1]))))
