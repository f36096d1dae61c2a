"""A plan as torchtitan 0.3.0's command line: ``--module M --config C`` and CLI overrides.

torchtitan 0.3.0 (PyPI) has no TOML job config: ``torchtitan.config.ConfigManager().parse_args(argv)``
imports ``torchtitan.models.M.config_registry``, calls its function ``C`` for a ``Trainer.Config``,
and applies the ``--section.key value`` overrides with tyro (``torchtitan/config/manager.py``).
Every parallelism value is given explicitly, since the registry functions set their own (llama3_405b
sets tp=8, deepseek_v3_671b ep=2, ...).  The 0.2.x TOML is ``autoplan.export.torchtitan_toml``.

Mapping (plan → override; ``torchtitan/config/configs.py`` ``ParallelismConfig``/``TrainingConfig``):

* dp: zero 2/3 → ``parallelism.data_parallel_shard_degree`` = dp (FSDP2) with
  ``fsdp_reshard_after_forward`` never (zero 2) / always (zero 3); zero 0 →
  ``data_parallel_replicate_degree`` = dp (DDP); zero 1 runs as zero 2 (warned).
* tp → ``tensor_parallel_degree``; sp → ``enable_sequence_parallel`` (new in 0.3).
* pp → ``pipeline_parallel_degree``, schedule → ``pipeline_parallel_schedule`` (torch names), mbs →
  ``pipeline_parallel_microbatch_size``, cuts → ``module_fqns_per_model_part`` (model order; torch's V
  schedules place the chunks V-wise themselves); pp > 1 needs ``training.disable_cuda_graphs``
  (``Trainer.Config._validate_cuda_graphs``), as does ep > 1 with a host-syncing token dispatcher.
* cp → ``context_parallel_degree`` (ring attention; 0.3 dropped ``context_parallel_rotate_method``;
  Ulysses/USP are warned).
* ep → ``expert_parallel_degree``.  0.3 has no expert tensor parallelism (0.2's
  ``expert_tensor_parallel_degree`` is gone): EP borrows ranks from dp_shard·cp·tp
  (``distributed/parallel_dims.py``), each expert whole.  With tp > 1 the plan's experts are split over
  tp, so ep·tp is given — the same experts per GPU — and warned about.
* precision: 0.3 sets its converters in Python only (``model_registry(converters=...)``, no CLI
  override), so a low-precision plan names ``--module autoplan.export.torchtitan_precision --config
  <module>__<config>__<recipe>``: the registry's config with its blocks' linear layers converted
  (``autoplan.export.torchtitan_precision``).  fp8-rowwise → float8 ``rowwise``, mxfp8 → MXFP8; 0.3
  has no tensorwise or delayed float8 recipe nor FSDP float8 all-gather, so fp8 and fp8-delayed run
  as rowwise (warned; ``--to torchtitan@0.2`` carries tensorwise with FP8 all-gathers).
* recompute → the ``activation_checkpoint:{none,full,selective}`` subcommand, last (0.3 dropped
  ``selective_ac_option``; ``selective`` is per-op SAC, autoplan's ``op``; the plan's ``selective``,
  Megatron's attention-core recomputation, runs as it and is warned about).
"""
from __future__ import annotations

from autoplan.export.base import Export, Setting, Settings, default_order_warning, stage_layers, uniform_recompute
from autoplan.export.torchtitan_precision import config_name
from autoplan.plan import DEFAULT_ORDER, Plan, recompute_layers
from costmodels.precision import is_low_precision

TORCHTITAN_VERSION = "0.3.0"
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zb-h1": "InterleavedZeroBubble",
    "zb-h2": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
# zoo model → (--module, --config) of torchtitan 0.3.0's config registries
CONFIGS = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
STAND_IN = ("llama3", "llama3_debugmodel")
# what a registry config builds beyond the plan (every estimate is priced in bf16)
CONFIG_NOTES = {
    "llama3-405b": "torchtitan's llama3_405b config trains its linear layers in float8 (Float8LinearConverter, "
                   "set in Python, no CLI override) and the plan is priced in bf16: write a bf16 config to match",
}
SELECTIVE_WARNING = ("recompute=selective (Megatron's attention-core recomputation) is not in torchtitan: "
                     "its selective activation checkpointing is per-op SAC (recompute=op: every second matmul "
                     "recomputed), slower than the plan's estimate, within its memory")


HEAD_MODULE = "lm_head"   # the output projection's FQN in torchtitan 0.3's Decoder (0.2's models: ``output``)


def model_parts(layers: tuple[int, ...], head: str = HEAD_MODULE) -> list[list[str]]:
    """Module FQNs of each model chunk: embedding with the first, norm and ``head`` with the last."""
    parts, start = [], 0
    for i, n in enumerate(layers):
        part = [f"layers.{k}" for k in range(start, start + n)]
        if i == 0:
            part.insert(0, "tok_embeddings")
        if i == len(layers) - 1:
            part += ["norm", head]
        parts.append(part)
        start += n
    return parts


def to_torchtitan(plan: Plan, *, num_layers: int | None = None, global_batch: int | None = None,
                  seq: int | None = None, model: str | None = None) -> Export:
    """``plan`` as torchtitan 0.3.0 arguments (module docstring); ``Export.argv`` is the list."""
    settings = (_config(model, plan.precision) + _data_parallel(plan) + _tensor_parallel(plan)
                + _pipeline(plan, num_layers) + _context_parallel(plan) + _expert_parallel(plan)
                + _training(plan, global_batch, seq) + _activation_checkpoint(plan))
    argv = tuple(arg for s in settings.items for arg in _args(s))
    header = [f"# autoplan plan {plan.to_string()}",
              f"# torchtitan {TORCHTITAN_VERSION}: torchtitan.config.ConfigManager().parse_args(argv) "
              "(torchtitan/config/manager.py)"]
    lines = [" ".join(_args(s)) for s in settings.items]
    text = "\n".join(header) + "\n" + " \\\n".join(lines) + "\n"
    return Export(engine="torchtitan", text=text, warnings=settings.warnings, argv=argv)


def _args(s: Setting) -> tuple[str, ...]:
    if s.value is None:
        return (s.name,)
    if isinstance(s.value, list):                       # module_fqns_per_model_part: one A,B,C per chunk
        return (s.name, *(",".join(part) for part in s.value))
    return (s.name, str(s.value))


def _config(model: str | None, precision: str) -> Settings:
    """The registry config of ``model`` (a stand-in when torchtitan ships none), converted to the
    plan's precision where it is not bf16 (module docstring)."""
    module, config = CONFIGS.get(model or "", STAND_IN)
    warnings: tuple[str, ...] = () if model in CONFIGS else (
        f"torchtitan {TORCHTITAN_VERSION} ships no config for {model or 'an unnamed model'}: "
        f"--module {module} --config {config} stand in (every parallelism value below is explicit); "
        "replace them with your model's config_registry module and function",)
    if not is_low_precision(precision):
        warnings += (CONFIG_NOTES[model],) if model in CONFIG_NOTES else ()
        return Settings((Setting("--module", module), Setting("--config", config)), warnings)
    recipe = "mxfp8" if precision == "mxfp8" else "rowwise"
    if precision in ("fp8", "fp8-delayed"):
        warnings += (f"precision={precision} ({'tensorwise dynamic' if precision == 'fp8' else 'delayed'} "
                     f"scaling) is not in torchtitan {TORCHTITAN_VERSION}, whose float8 recipes are rowwise "
                     "and rowwise_with_gw_hp (no FSDP float8 all-gather either): float8 rowwise, slower than "
                     "the plan's estimate; `--to torchtitan@0.2` carries tensorwise scaling"
                     + (" with FP8 all-gathers" if precision == "fp8" else ""),)
    return Settings((Setting("--module", "autoplan.export.torchtitan_precision"),
                     Setting("--config", config_name(module, config, recipe))), warnings)


def _data_parallel(plan: Plan) -> Settings:
    """zero 0: DDP over dp; zero 1/2/3: FSDP2 over dp (zero 1 warned), resharding after forward under
    zero 3; ep > 1 needs FSDP (EP borrows dp_shard ranks), so zero 0 with ep runs as zero 2 (warned)."""
    fsdp = plan.zero > 0 or plan.ep > 1
    replicate, shard = (1, plan.dp) if fsdp else (plan.dp, 1)
    keys = (Setting("--parallelism.data_parallel_replicate_degree", replicate),
            Setting("--parallelism.data_parallel_shard_degree", shard),
            Setting("--parallelism.fsdp_reshard_after_forward",
                    "always" if plan.zero >= 3 else "never" if fsdp and plan.dp > 1 else "default"))
    warnings: tuple[str, ...] = ()
    if plan.dp > 1 and plan.zero == 1:
        warnings = ("zero=1 has no torchtitan form: FSDP with fsdp_reshard_after_forward never "
                    "(zero=2: gradients sharded too)",)
    elif plan.dp > 1 and plan.zero == 0 and plan.ep > 1:
        warnings = ("zero=0 with ep > 1 has no torchtitan form (its EP borrows FSDP ranks): FSDP with "
                    "fsdp_reshard_after_forward never (zero=2: optimizer state and gradients sharded)",)
    return Settings(keys, warnings)


def _tensor_parallel(plan: Plan) -> Settings:
    sp = "--parallelism.enable_sequence_parallel" if plan.sp or plan.tp == 1 else \
        "--parallelism.no_enable_sequence_parallel"
    return Settings((Setting("--parallelism.tensor_parallel_degree", plan.tp), Setting(sp)))


def _pipeline(plan: Plan, num_layers: int | None) -> Settings:
    """pp, its torch schedule and micro-batch size, and the stage cuts as module FQNs when the layer
    count is known; CUDA graphs off (torchtitan refuses them under pp)."""
    keys = Settings((Setting("--parallelism.pipeline_parallel_degree", plan.pp),
                     Setting("--parallelism.pipeline_parallel_schedule", SCHEDULES[plan.schedule]),
                     Setting("--parallelism.pipeline_parallel_microbatch_size", plan.mbs)))
    if plan.pp == 1:
        return keys
    return keys + stage_cuts(plan, num_layers, "--parallelism.module_fqns_per_model_part")


def stage_cuts(plan: Plan, num_layers: int | None, key: str, head: str = HEAD_MODULE) -> Settings:
    """A pipeline plan's stage cuts as module FQNs under ``key`` when the layer count is known (both
    torchtitan targets), and the zb-h2 warning (torch pipelining runs it as ZB1P)."""
    keys = Settings()
    if plan.schedule == "zb-h2":
        keys += Settings(warnings=("schedule=zb-h2 is not in torch pipelining: InterleavedZeroBubble "
                                   "(ZB1P, one model chunk per rank)",))
    layers = stage_layers(plan, num_layers)
    if layers is None:
        return keys + Settings(warnings=("stage cuts left to torchtitan (its default split) because the layer "
                                         "count is unknown: pass --model to pin them",))
    return keys + Settings((Setting(key, model_parts(layers, head)),))


def _context_parallel(plan: Plan) -> Settings:
    """cp as ring attention (torchtitan's only CP); Ulysses/USP run as ring."""
    warnings = ((f"cp_algo={plan.cp_algo} is not in torchtitan {TORCHTITAN_VERSION}: ring attention",)
                if plan.cp > 1 and plan.cp_algo != "ring" else ())
    return Settings((Setting("--parallelism.context_parallel_degree", plan.cp),), warnings)


def _expert_parallel(plan: Plan) -> Settings:
    """ep, ×tp when the experts are split over tp (no expert TP in 0.3), and the axis-order warning."""
    warnings = tuple(w for w in (default_order_warning(plan, "torchtitan", DEFAULT_ORDER),) if w)
    degree, etp = plan.ep, plan.expert_tp          # a folded plan's experts split over etp, not tp
    if plan.ep > 1 and etp > 1:
        degree = plan.ep * etp
        axis = "etp" if plan.folded else "tp"
        warnings += (f"ep={plan.ep} with {axis}={etp} (experts split over {axis}) is not in torchtitan "
                     f"{TORCHTITAN_VERSION}, which has no expert tensor parallelism: expert_parallel_degree "
                     f"{degree} (ep·tp, whole experts, as many per GPU as the plan's; the expert all-to-all "
                     "spans the tp ranks too and needs the expert count divisible by it); "
                     "`--to torchtitan@0.2` carries expert_tensor_parallel_degree",)
    if plan.dispatcher == "deepep":
        warnings += (f"dispatcher=deepep is chosen in Python in torchtitan {TORCHTITAN_VERSION} "
                     "(model_registry(flavor, moe_comm_backend=\"deepep\") in a config_registry function), "
                     "not on the command line: as exported it runs the standard all-to-all, which the plan "
                     "does not price",)
    if plan.ep_overlap:
        warnings += (f"ep_overlap=on (combined 1F1B) is not in torchtitan {TORCHTITAN_VERSION}: its EP "
                     "transfers run exposed, slower than the plan's estimate",)
    return Settings((Setting("--parallelism.expert_parallel_degree", degree),), warnings)


def batch_keys(plan: Plan, global_batch: int | None, seq: int | None, prefix: str) -> tuple[Setting, ...]:
    """local/global batch sizes (a rank's local batch is its share of the global one under pp, else
    one micro-batch) and the sequence length, where given, each key under ``prefix``."""
    keys: tuple[Setting, ...] = ()
    if global_batch is not None:
        keys += (Setting(f"{prefix}local_batch_size", global_batch // plan.dp if plan.pp > 1 else plan.mbs),
                 Setting(f"{prefix}global_batch_size", global_batch))
    if seq is not None:
        keys += (Setting(f"{prefix}seq_len", seq),)
    return keys


def _training(plan: Plan, global_batch: int | None, seq: int | None) -> Settings:
    """Batch sizes (a rank's local batch is its share of the global one under pp, else one micro-batch),
    the sequence length where given, and CUDA graphs off where torchtitan refuses them."""
    keys = batch_keys(plan, global_batch, seq, "--training.")
    if plan.pp > 1 or plan.ep > 1:
        keys += (Setting("--training.disable_cuda_graphs"),)
    return Settings(keys)


def _activation_checkpoint(plan: Plan) -> Settings:
    """The plan's one recompute mode (``uniform_recompute``) as the subcommand, which tyro reads last;
    full:N, which torchtitan lacks, runs as full."""
    mode, note = uniform_recompute(plan)
    warnings: tuple[str, ...] = (note,) if note else ()
    if recompute_layers(mode) is not None:
        warnings += (f"recompute={mode} (the first N layers of each stage) is not in torchtitan: "
                     "activation_checkpoint:full on every layer",)
        mode = "full"
    if mode == "selective":
        warnings += (SELECTIVE_WARNING,)
    subcommand = {"none": "none", "full": "full", "op": "selective", "selective": "selective"}[mode]
    return Settings((Setting(f"activation_checkpoint:{subcommand}"),), warnings)
