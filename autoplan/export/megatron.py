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

from autoplan.export.base import Export, stage_layers, uniform_recompute
from autoplan.plan import recompute_layers
from autoplan.plan import DEFAULT_ORDER, Plan

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
    warnings: list[str] = []
    args: list[tuple[str, object]] = []
    if num_layers is not None:
        args.append(("--num-layers", num_layers))
    if seq is not None:
        args.append(("--seq-length", seq))
    args.append(("--tensor-model-parallel-size", plan.tp))
    if plan.sp:
        args.append(("--sequence-parallel", None))
    args.append(("--pipeline-model-parallel-size", plan.pp))
    if plan.pp > 1:
        layers = stage_layers(plan, num_layers)
        vpp = plan.vpp
        if plan.schedule in ("zbv", "dualpipev"):
            warnings.append(f"schedule={plan.schedule} (V placement) is not in Megatron-LM: interleaved 1F1B "
                            "with 2 model chunks per rank in loop placement")
        elif plan.schedule in ("zb-h1", "zb-h2"):
            warnings.append(f"schedule={plan.schedule} is not in Megatron-LM: 1F1B (same stages)")
        elif plan.schedule == "gpipe":
            warnings.append("schedule=gpipe is not in Megatron-LM: 1F1B (same result, "
                            "fewer micro-batches in flight)")
        if layers is not None and len(set(layers)) > 1:
            args.append(("--pipeline-model-parallel-layout", f'"{pipeline_layout(layers)}"'))
        elif vpp > 1 and layers is not None:
            args.append(("--num-layers-per-virtual-pipeline-stage", layers[0]))
        elif vpp > 1:
            args.append(("--num-virtual-stages-per-pipeline-rank", vpp))
    if plan.cp > 1:
        args.append(("--context-parallel-size", plan.cp))
        args.append(("--cp-comm-type", CP_COMM[plan.cp_algo]))
        if plan.cp_algo == "usp":
            warnings.append("cp_algo=usp: also pass --hierarchical-context-parallel-sizes "
                            "<a2a size> <p2p size> (the plan does not record the split)")
    if plan.ep > 1:
        args.append(("--expert-model-parallel-size", plan.ep))
    if plan.dp > 1:
        if plan.zero == 1:
            args.append(("--use-distributed-optimizer", None))
        elif plan.zero >= 2:
            args.append(("--use-megatron-fsdp", None))
            args.append(("--data-parallel-sharding-strategy",
                         "optim_grads_params" if plan.zero >= 3 else "optim_grads"))
    mode, note = uniform_recompute(plan)
    if note:
        warnings.append(note)
    if mode == "op":
        warnings.append("recompute=op (torchtitan's selective op checkpointing) is not in Megatron-LM: "
                        "--recompute-granularity full on every layer")
        mode = "full"
    if recompute_layers(mode) is not None:
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", recompute_layers(mode))]
    elif mode != "none":
        args.append(("--recompute-granularity", mode))
        if mode == "full":
            args += [("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    args.append(("--micro-batch-size", plan.mbs))
    if global_batch is not None:
        args.append(("--global-batch-size", global_batch))
    if plan.order == TP_PP_DP_ORDER:
        args.append(("--use-tp-pp-dp-mapping", None))
    elif plan.order != DEFAULT_ORDER:
        warnings.append(f"order={'-'.join(plan.order)} is not expressible: Megatron-LM lays ranks out as "
                        f"{'-'.join(DEFAULT_ORDER)} or {'-'.join(TP_PP_DP_ORDER)} (innermost first)")
    lines = [f"# autoplan plan {plan.to_string()}",
             f"# Megatron-LM arguments (megatron/training/arguments.py @ {MEGATRON_COMMIT[:12]})"]
    lines += [flag if value is None else f"{flag} {value}" for flag, value in args]
    text = lines[0] + "\n" + lines[1] + "\n" + " \\\n".join(lines[2:]) + "\n"
    return Export(engine="megatron", text=text, warnings=tuple(warnings))
