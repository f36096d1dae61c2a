"""A plan as Megatron-LM command-line arguments.

Targets ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at commit
000c4ac24f61159c138b0975def722c65245983c (flag names checked against that file;
``--pipeline-model-parallel-layout`` and the Megatron-FSDP flags are recent
additions that older releases lack).

Mapping (plan → flags):

* tp → ``--tensor-model-parallel-size``, sp → ``--sequence-parallel``.
* pp → ``--pipeline-model-parallel-size``; vpp with an even split →
  ``--num-layers-per-virtual-pipeline-stage`` (``--num-virtual-stages-per-pipeline-rank``
  when the layer count is unknown); uneven stage cuts →
  ``--pipeline-model-parallel-layout`` (E = embedding, t = layer, L = loss, stages
  split by "|", in virtual-stage order).
* schedule: 1f1b and interleaved are Megatron's own; gpipe, zb-h1/h2, zbv and
  dualpipev are not in Megatron-LM and run as 1F1B / interleaved (warned).
* cp → ``--context-parallel-size``; ring/ulysses/usp → ``--cp-comm-type``
  p2p/a2a/a2a+p2p.
* ep → ``--expert-model-parallel-size``.
* zero 1 → ``--use-distributed-optimizer``; zero 2/3 → ``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``.
* recompute → ``--recompute-granularity`` (full adds ``--recompute-method uniform
  --recompute-num-layers 1``; full:N is ``--recompute-method block --recompute-num-layers N``;
  op, which Megatron lacks, becomes full with a warning).
* mbs → ``--micro-batch-size``; global batch → ``--global-batch-size``.
* order tp-cp-ep-dp-pp is Megatron's default; tp-cp-ep-pp-dp →
  ``--use-tp-pp-dp-mapping``.
"""
from __future__ import annotations

from autoplan.export.base import Export, Setting, Settings, stage_layers, uniform_recompute
from autoplan.plan import DEFAULT_ORDER, SCHEDULE_SPECS, Plan, recompute_layers

MEGATRON_COMMIT = "000c4ac24f61159c138b0975def722c65245983c"
CP_COMM = {"ring": "p2p", "ulysses": "a2a", "usp": "a2a+p2p"}
TP_PP_DP_ORDER = ("tp", "cp", "ep", "pp", "dp")


def pipeline_layout(layers: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` of per-stage layer counts (virtual-stage order)."""
    stages = ["t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def to_megatron(plan: Plan, *, num_layers: int | None = None, global_batch: int | None = None,
                seq: int | None = None) -> Export:
    """``plan`` as Megatron-LM arguments, one group of flags per part of the plan (module docstring)."""
    flags = (_size_flags(num_layers, seq) + _tensor_flags(plan) + _pipeline_flags(plan, num_layers)
             + _context_flags(plan) + _expert_flags(plan) + _data_parallel_flags(plan) + _recompute_flags(plan)
             + _batch_flags(plan, global_batch) + _order_flags(plan))
    return Export(engine="megatron", text=_command_line(plan, flags.items), warnings=flags.warnings)


def _size_flags(num_layers: int | None, seq: int | None) -> Settings:
    items = [Setting("--num-layers", num_layers)] if num_layers is not None else []
    items += [Setting("--seq-length", seq)] if seq is not None else []
    return Settings(tuple(items))


def _tensor_flags(plan: Plan) -> Settings:
    items = [Setting("--tensor-model-parallel-size", plan.tp)]
    items += [Setting("--sequence-parallel")] if plan.sp else []
    return Settings(tuple(items))


def _pipeline_flags(plan: Plan, num_layers: int | None) -> Settings:
    """pp, and the virtual stages: even (layers per virtual stage, or stages per rank when the
    layer count is unknown) or uneven (the layout string)."""
    size = Settings((Setting("--pipeline-model-parallel-size", plan.pp),))
    if plan.pp == 1:
        return size
    layers = stage_layers(plan, num_layers)
    cuts: tuple[Setting, ...]
    if layers is not None and len(set(layers)) > 1:
        cuts = (Setting("--pipeline-model-parallel-layout", f'"{pipeline_layout(layers)}"'),)
    elif plan.vpp > 1 and layers is not None:
        cuts = (Setting("--num-layers-per-virtual-pipeline-stage", layers[0]),)
    elif plan.vpp > 1:
        cuts = (Setting("--num-virtual-stages-per-pipeline-rank", plan.vpp),)
    else:
        cuts = ()
    return size + Settings(cuts, _schedule_warnings(plan.schedule))


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


def _context_flags(plan: Plan) -> Settings:
    if plan.cp == 1:
        return Settings()
    warnings = ("cp_algo=usp: also pass --hierarchical-context-parallel-sizes "
                "<a2a size> <p2p size> (the plan does not record the split)",) if plan.cp_algo == "usp" else ()
    return Settings((Setting("--context-parallel-size", plan.cp), Setting("--cp-comm-type", CP_COMM[plan.cp_algo])),
                    warnings)


def _expert_flags(plan: Plan) -> Settings:
    return Settings((Setting("--expert-model-parallel-size", plan.ep),) if plan.ep > 1 else ())


def _data_parallel_flags(plan: Plan) -> Settings:
    """zero 1: the distributed optimizer; zero 2/3: Megatron-FSDP."""
    if plan.dp == 1 or plan.zero == 0:
        return Settings()
    if plan.zero == 1:
        return Settings((Setting("--use-distributed-optimizer"),))
    strategy = "optim_grads_params" if plan.zero >= 3 else "optim_grads"
    return Settings((Setting("--use-megatron-fsdp"), Setting("--data-parallel-sharding-strategy", strategy)))


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
