"""A plan as Megatron-LM command-line arguments.

Targets ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22; flag names and the ``validate_args``
constraints checked against that file and the ``TransformerConfig`` checks in
``megatron/core/transformer/transformer_config.py``; tests/autoplan/export/megatron_validate_args.py
encodes them).

Mapping (plan → flags):

* ``--bf16``: the mixed precision every estimate assumes (Megatron's default is fp32).
* precision (the linear layers' GEMMs, Transformer Engine): fp8 → ``--fp8-format hybrid --fp8-recipe
  tensorwise`` (current scaling), fp8-delayed → ``delayed``, mxfp8 → ``mxfp8``; fp8-rowwise, which
  Megatron lacks, runs as ``blockwise`` (1×128 / 128×128 scales; warned).  ``--fp8-param-gather``
  where the plan prices FP8 parameter gathers (``costmodels.precision.gather_bytes_per_param``:
  tensorwise at ZeRO-3, under Megatron-FSDP, which ``validate_args`` requires of it).
* tp → ``--tensor-model-parallel-size``, sp → ``--sequence-parallel``.
* pp → ``--pipeline-model-parallel-size``; vpp with an even split →
  ``--num-layers-per-virtual-pipeline-stage`` (``--num-virtual-stages-per-pipeline-rank``
  when the layer count is unknown); uneven stage cuts →
  ``--pipeline-model-parallel-layout`` (E = embedding, t = layer, L = loss, stages split by "|")
  in Megatron's order: entry ``v·pp + r`` is chunk v of pipeline rank r
  (``PipelineParallelLayerLayout``), so a V schedule's cut (rank r holds stages r and 2·pp−1−r)
  is listed as the counts each rank holds, not in V order.
* schedule: 1f1b and interleaved are Megatron's own; gpipe, zb-h1/h2, zbv and dualpipev run as
  1F1B / interleaved (warned).  The zero-bubble and DualPipeV plans of MoE models (ep > 1, virtual
  stages under pp > 1, no full recomputation) get ``--overlap-moe-expert-parallel-comm
  --delay-wgrad-compute``: the expert all-to-all overlapped across micro-batches and the weight
  gradients split off, Megatron's form of the W split (``TransformerConfig`` asserts those
  preconditions; other plans are warned).
* cp → ``--context-parallel-size``; ring/ulysses → ``--cp-comm-type`` p2p/a2a; usp → ``a2a+p2p`` with
  ``--hierarchical-context-parallel-sizes U R`` (Ulysses inside, ring across), the split autoplan's
  rule fixes (``autoplan.rules.ulysses_and_ring``) for the cluster's NVLink domain.
* ep → ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` tp (the plan's experts
  are split over tp) or etp (a folded plan), and the dispatcher the plan prices: alltoall →
  ``--moe-token-dispatcher-type alltoall`` (Megatron's default is allgather), deepep →
  ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep``.  ``ep_overlap=on``
  → ``--overlap-moe-expert-parallel-comm`` (combined 1F1B; refused by TransformerConfig under full
  recomputation or pp > 1 without virtual stages: dropped and warned).
* zero 1 → ``--use-distributed-optimizer``; zero 2/3 → ``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params`` and ``--ckpt-format
  fsdp_dtensor`` (``validate_args`` asserts it under Megatron-FSDP).
* recompute → ``--recompute-granularity`` (full adds ``--recompute-method uniform
  --recompute-num-layers 1``; full:N is ``--recompute-method block --recompute-num-layers N``;
  op, which Megatron lacks, becomes full with a warning).
* mbs → ``--micro-batch-size``; global batch → ``--global-batch-size``.
* the model's architecture where a plan needs it priced as traced (``base.Architecture``): multi-head
  latent attention → ``--multi-latent-attention --q-lora-rank --kv-lora-rank --qk-head-dim`` (the q/k
  head without its rotary slice) ``--qk-pos-emb-head-dim --v-head-dim`` (``MLATransformerConfig``);
  multi-token prediction → ``--mtp-num-layers``, its layers ``m`` on the last stage of an uneven layout
  (before the loss ``L``, as Megatron-Bridge's DeepSeek-V3 layout ``...|tmL``).
* order tp-cp-ep-dp-pp is Megatron's default; tp-cp-ep-pp-dp →
  ``--use-tp-pp-dp-mapping``.
"""
from __future__ import annotations

from autoplan.export.base import PLAIN, Architecture, Export, Setting, Settings, stage_layers, uniform_recompute
from autoplan.mesh import Mesh
from autoplan.plan import DEFAULT_ORDER, SCHEDULE_SPECS, Plan, fully_recomputes, recompute_layers
from autoplan.rules import ulysses_and_ring
from costmodels.precision import BF16_BYTES, gather_bytes_per_param, is_low_precision

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
# plan precision → --fp8-recipe (TransformerConfig.fp8_recipe: tensorwise | delayed | mxfp8 | blockwise | custom)
FP8_RECIPES = {"fp8": "tensorwise", "fp8-delayed": "delayed", "mxfp8": "mxfp8", "fp8-rowwise": "blockwise"}
CP_COMM = {"ring": "p2p", "ulysses": "a2a", "usp": "a2a+p2p"}
# plan dispatcher → Megatron-Core's token dispatcher (TransformerConfig.moe_token_dispatcher_type and, for
# flex, moe_flex_dispatcher_backend: DeepEP's hierarchical dispatch)
DISPATCHER_FLAGS = {"alltoall": (Setting("--moe-token-dispatcher-type", "alltoall"),),
                    "deepep": (Setting("--moe-token-dispatcher-type", "flex"),
                               Setting("--moe-flex-dispatcher-backend", "deepep"))}
TP_PP_DP_ORDER = ("tp", "cp", "ep", "pp", "dp")
DEFAULT_NVLINK_DOMAIN = 8        # GPUs per NVLink domain of an H100/A100 node, when no cluster is named


def pipeline_layout(layers: tuple[int, ...], mtp_layers: int = 0) -> str:
    """``--pipeline-model-parallel-layout`` of per-stage layer counts, in Megatron's stage order (the
    multi-token-prediction layers ``m`` with the loss)."""
    stages = ["t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp_layers + "L"
    return "|".join(stages)


def megatron_order(plan: Plan, layers: tuple[int, ...]) -> tuple[int, ...]:
    """The plan's layers per virtual stage (model order) as Megatron lists its stages: entry
    ``v·pp + r`` is the v-th chunk of pipeline rank r (``PipelineParallelLayerLayout.__init__``), so each
    rank holds the layer counts the plan gives it; the identity for looped schedules."""
    return tuple(layers[plan.stages_of_rank(r)[v]] for v in range(plan.vpp) for r in range(plan.pp))


def to_megatron(plan: Plan, *, num_layers: int | None = None, global_batch: int | None = None,
                seq: int | None = None, nvlink_domain: int | None = None,
                arch: Architecture = PLAIN) -> Export:
    """``plan`` as Megatron-LM arguments, one group of flags per part of the plan (module docstring)."""
    flags = (_size_flags(num_layers, seq) + _architecture_flags(arch) + _precision_flags(plan) + _tensor_flags(plan)
             + _pipeline_flags(plan, num_layers, arch.mtp_layers)
             + _schedule_flags(plan) + _context_flags(plan, nvlink_domain) + _expert_flags(plan)
             + _data_parallel_flags(plan) + _recompute_flags(plan) + _batch_flags(plan, global_batch)
             + _order_flags(plan))
    return Export(engine="megatron", text=_command_line(plan, flags.items), warnings=flags.warnings)


def _size_flags(num_layers: int | None, seq: int | None) -> Settings:
    items = [Setting("--num-layers", num_layers)] if num_layers is not None else []
    items += [Setting("--seq-length", seq)] if seq is not None else []
    return Settings(tuple(items) + (Setting("--bf16"),))


def _architecture_flags(arch: Architecture) -> Settings:
    """Multi-head latent attention's and multi-token prediction's model arguments (module docstring)."""
    items: tuple[Setting, ...] = ()
    if arch.kv_lora_rank:
        items += (Setting("--multi-latent-attention"),)
        items += (Setting("--q-lora-rank", arch.q_lora_rank),) if arch.q_lora_rank else ()
        items += (Setting("--kv-lora-rank", arch.kv_lora_rank), Setting("--qk-head-dim", arch.qk_head_dim),
                  Setting("--qk-pos-emb-head-dim", arch.qk_rope_dim), Setting("--v-head-dim", arch.v_head_dim))
    items += (Setting("--mtp-num-layers", arch.mtp_layers),) if arch.mtp_layers else ()
    return Settings(items)


def _precision_flags(plan: Plan) -> Settings:
    """FP8 GEMMs through Transformer Engine (E4M3 forward, E5M2 gradients: ``hybrid``) with the
    plan's scaling recipe, and FP8 parameter gathers where the plan prices them (module docstring)."""
    if not is_low_precision(plan.precision):
        return Settings()
    items: tuple[Setting, ...] = (Setting("--fp8-format", "hybrid"),
                                  Setting("--fp8-recipe", FP8_RECIPES[plan.precision]))
    if gather_bytes_per_param(plan.precision, plan.zero) < BF16_BYTES:
        items += (Setting("--fp8-param-gather"),)
    warnings = ("precision=fp8-rowwise (a scale per row) is not a Megatron-LM recipe: --fp8-recipe blockwise "
                "(a scale per 1×128 tile of activations and gradients, per 128×128 block of weights), "
                "finer than the plan's and priced as neither",) if plan.precision == "fp8-rowwise" else ()
    return Settings(items, warnings)


def _tensor_flags(plan: Plan) -> Settings:
    items = [Setting("--tensor-model-parallel-size", plan.tp)]
    items += [Setting("--sequence-parallel")] if plan.sp else []
    return Settings(tuple(items))


def _pipeline_flags(plan: Plan, num_layers: int | None, mtp_layers: int = 0) -> Settings:
    """pp, and the virtual stages: even (layers per virtual stage, or stages per rank when the
    layer count is unknown) or uneven (the layout string, in Megatron's stage order)."""
    size = Settings((Setting("--pipeline-model-parallel-size", plan.pp),))
    if plan.pp == 1:
        return size
    layers = stage_layers(plan, num_layers)
    if layers is not None and len(set(layers)) > 1:
        ordered = megatron_order(plan, layers)
        cuts = Settings((Setting("--pipeline-model-parallel-layout", f'"{pipeline_layout(ordered, mtp_layers)}"'),))
        if SCHEDULE_SPECS[plan.schedule].placement == "v":
            cuts += Settings(warnings=(f"schedule={plan.schedule}'s cut goes to Megatron-LM rank by rank (each rank "
                                       "keeps its layer counts), but Megatron places the output layer and loss "
                                       f"on pipeline rank {plan.pp - 1}, not on rank 0 as the V places them",))
    elif plan.vpp > 1 and layers is not None:
        cuts = Settings((Setting("--num-layers-per-virtual-pipeline-stage", layers[0]),))
    elif plan.vpp > 1:
        cuts = Settings((Setting("--num-virtual-stages-per-pipeline-rank", plan.vpp),))
    else:
        cuts = Settings()
    return size + cuts


def _schedule_warnings(schedule: str) -> tuple[str, ...]:
    """What Megatron-LM runs instead of a schedule it lacks."""
    spec = SCHEDULE_SPECS[schedule]
    if spec.placement == "v":
        return (f"schedule={schedule} (V placement) is not in Megatron-LM: interleaved 1F1B "
                "with 2 model chunks per rank in loop placement",)
    if spec.split_backward:
        return (f"schedule={schedule} is not in Megatron-LM: 1F1B (same stages)",)
    if schedule == "gpipe":
        return ("schedule=gpipe is not in Megatron-LM: 1F1B (same result, "
                "fewer micro-batches in flight)",)
    return ()


def _schedule_flags(plan: Plan) -> Settings:
    """Megatron's stand-in schedule (warned), and the EP all-to-all overlap with, for zero-bubble and
    DualPipeV plans, its W split (``_moe_overlap_flags``)."""
    warnings = _schedule_warnings(plan.schedule) if plan.pp > 1 else ()
    return Settings(warnings=warnings) + _moe_overlap_flags(plan)


def _moe_overlap_flags(plan: Plan) -> Settings:
    """``--overlap-moe-expert-parallel-comm`` for a plan that prices combined 1F1B (``ep_overlap``)
    or splits its weight gradients off (zero-bubble, DualPipeV: ``--delay-wgrad-compute``, which
    Megatron runs only beside that overlap).  Where TransformerConfig refuses the overlap
    (``_overlap_blocker``) the flags are dropped and the plan's pricing is warned about."""
    split = plan.pp > 1 and SCHEDULE_SPECS[plan.schedule].split_backward
    if not (plan.ep_overlap or split):
        return Settings()
    blocker = _overlap_blocker(plan)
    if blocker:
        what = (f"schedule={plan.schedule}'s weight-gradient split has no Megatron-LM form here: "
                "--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm" if split else
                "ep_overlap=on (priced with the EP all-to-all under the paired micro-batch's compute) "
                "is not run: --overlap-moe-expert-parallel-comm")
        return Settings(warnings=(f"{what}, which {blocker}",))
    items = (Setting("--overlap-moe-expert-parallel-comm"),)
    return Settings(items + ((Setting("--delay-wgrad-compute"),) if split else ()))


def _overlap_blocker(plan: Plan) -> str | None:
    """Why ``--overlap-moe-expert-parallel-comm`` is refused for ``plan`` (TransformerConfig.__post_init__
    asserts ep > 1, virtual stages under pp > 1, no full recomputation), or None."""
    if plan.ep == 1:
        return "needs expert parallelism (ep > 1)"
    if plan.pp > 1 and plan.vpp == 1:
        return "needs virtual pipeline stages under pp > 1"
    mode, _ = uniform_recompute(plan)
    if fully_recomputes(mode):
        return f"refuses full recomputation (recompute={mode} runs as --recompute-granularity full)"
    return None


def usp_split(plan: Plan, nvlink_domain: int) -> tuple[int, int]:
    """(Ulysses size, ring size) of a USP plan: its ``ulysses=`` split, else autoplan's rule, Ulysses
    inside the NVLink domain."""
    return ulysses_and_ring(plan, Mesh.of(plan), nvlink_domain)


def _context_flags(plan: Plan, nvlink_domain: int | None) -> Settings:
    if plan.cp == 1:
        return Settings()
    flags = Settings((Setting("--context-parallel-size", plan.cp), Setting("--cp-comm-type", CP_COMM[plan.cp_algo])))
    if plan.cp_algo != "usp":
        return flags
    ulysses, ring = usp_split(plan, nvlink_domain or DEFAULT_NVLINK_DOMAIN)
    warnings = () if nvlink_domain or plan.ulysses else (
        f"cp_algo=usp split {ulysses}×{ring} (Ulysses × ring) for {DEFAULT_NVLINK_DOMAIN}-GPU NVLink domains: "
        "pass --cluster for the cluster's own",)
    return flags + Settings((Setting("--hierarchical-context-parallel-sizes", f"{ulysses} {ring}"),), warnings)


def _expert_flags(plan: Plan) -> Settings:
    """ep with the experts split over tp (etp = tp), or over etp when the plan folds them (MoE
    parallel folding: Megatron-Core's own expert grid), and the all-to-all dispatcher the plan prices."""
    if plan.ep == 1:
        return Settings()
    warnings = (f"ep={plan.ep} with cp={plan.cp}: Megatron-LM's expert groups fold over the cp ranks first "
                "(expert grid etp-ep-edp-pp), the plan's lie outside them: same group sizes, other ranks",
                ) if plan.cp > 1 and not plan.folded else ()
    return Settings((Setting("--expert-model-parallel-size", plan.ep),
                     Setting("--expert-tensor-parallel-size", plan.expert_tp))
                    + DISPATCHER_FLAGS[plan.dispatcher], warnings)


def _data_parallel_flags(plan: Plan) -> Settings:
    """zero 1: the distributed optimizer; zero 2/3: Megatron-FSDP, whose checkpoints must be
    ``fsdp_dtensor`` (validate_args)."""
    if plan.dp == 1 or plan.zero == 0:
        return Settings()
    if plan.zero == 1:
        return Settings((Setting("--use-distributed-optimizer"),))
    strategy = "optim_grads_params" if plan.zero >= 3 else "optim_grads"
    return Settings((Setting("--use-megatron-fsdp"), Setting("--data-parallel-sharding-strategy", strategy),
                     Setting("--ckpt-format", "fsdp_dtensor")))


def _recompute_flags(plan: Plan) -> Settings:
    """The plan's one recompute mode (``uniform_recompute``); op, which Megatron lacks, runs as full."""
    mode, note = uniform_recompute(plan)
    warnings: tuple[str, ...] = (note,) if note else ()
    items: tuple[Setting, ...]
    if mode == "op":
        warnings += ("recompute=op (torchtitan's selective op checkpointing) is not in Megatron-LM: "
                     "--recompute-granularity full on every layer",)
        mode = "full"
    if recompute_layers(mode) is not None:
        items = (Setting("--recompute-granularity", "full"), Setting("--recompute-method", "block"),
                 Setting("--recompute-num-layers", recompute_layers(mode)))
    elif mode == "full":
        items = (Setting("--recompute-granularity", mode), Setting("--recompute-method", "uniform"),
                 Setting("--recompute-num-layers", 1))
    elif mode != "none":
        items = (Setting("--recompute-granularity", mode),)
    else:
        items = ()
    return Settings(items, warnings)


def _batch_flags(plan: Plan, global_batch: int | None) -> Settings:
    items = [Setting("--micro-batch-size", plan.mbs)]
    items += [Setting("--global-batch-size", global_batch)] if global_batch is not None else []
    return Settings(tuple(items))


def _order_flags(plan: Plan) -> Settings:
    """Megatron lays ranks out in its default order or, with a flag, tp-cp-ep-pp-dp; nothing else."""
    if plan.order == TP_PP_DP_ORDER:
        return Settings((Setting("--use-tp-pp-dp-mapping"),))
    if plan.order != DEFAULT_ORDER:
        return Settings(warnings=(f"order={'-'.join(plan.order)} is not expressible: Megatron-LM lays ranks out as "
                                  f"{'-'.join(DEFAULT_ORDER)} or {'-'.join(TP_PP_DP_ORDER)} (innermost first)",))
    return Settings()


def _command_line(plan: Plan, flags: tuple[Setting, ...]) -> str:
    """Two comment lines, then one flag per line joined by backslash continuations."""
    lines = [f"# autoplan plan {plan.to_string()}",
             f"# Megatron-LM arguments (megatron/training/arguments.py @ {MEGATRON_COMMIT[:12]})"]
    lines += [f.name if f.value is None else f"{f.name} {f.value}" for f in flags]
    return lines[0] + "\n" + lines[1] + "\n" + " \\\n".join(lines[2:]) + "\n"
