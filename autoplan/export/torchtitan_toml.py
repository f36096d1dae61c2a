"""A plan as a torchtitan 0.2.x TOML fragment ([parallelism], [activation_checkpoint], [training]):
``autoplan export --to torchtitan@0.2``.

Targets torchtitan 0.2.2's TOML ``JobConfig`` (``torchtitan/config/job_config.py`` of the PyPI
release; key names checked against that file).  torchtitan 0.3.0 dropped the TOML job config
for Python config modules and CLI overrides (``autoplan.export.torchtitan``, the default target).

Mapping (plan → key):

* dp: zero 2/3 → ``data_parallel_shard_degree`` = dp (FSDP2) with
  ``fsdp_reshard_after_forward`` "never" (zero 2) / "always" (zero 3); zero 0 →
  ``data_parallel_replicate_degree`` = dp (DDP); zero 1 has no torchtitan form and
  runs as zero 2 (warned).
* tp → ``tensor_parallel_degree`` (torchtitan 0.2 always adds sequence parallelism and
  loss parallelism with TP; sp=off is warned).
* pp → ``pipeline_parallel_degree``, schedule → ``pipeline_parallel_schedule``
  (torch names), mbs → ``pipeline_parallel_microbatch_size``; stage cuts →
  ``module_fqns_per_model_part`` with the module names of torchtitan's decoder
  models (``tok_embeddings``, ``layers.N``, ``norm``, ``output``).
* cp → ``context_parallel_degree``; ring → ``context_parallel_rotate_method`` =
  "alltoall" (KV passed around the ring); Ulysses/USP have no torchtitan form (warned).
* ep → ``expert_parallel_degree`` (carved out of dp, as torchtitan's dp2ep), and with tp > 1
  ``expert_tensor_parallel_degree`` = tp: the plan's experts are split over tp, and
  torchtitan's default (1) would borrow the tp ranks for ep instead.
* precision → ``[model] converters`` and its section (0.2.2's ``Quantize`` config): fp8 →
  ``quantize.linear.float8`` with no recipe (tensorwise dynamic scaling) and, at zero 3 where the
  plan prices FP8 gathers, ``enable_fsdp_float8_all_gather`` + ``precompute_float8_dynamic_scale_for_fsdp``;
  fp8-rowwise → ``recipe_name = "rowwise"``; fp8-delayed, which torchtitan lacks, runs as tensorwise
  (warned); mxfp8 → ``quantize.linear.mx`` (``mxfp8_cublas``).  ``filter_fqns = ["output"]``: the LM
  head stays bf16, as priced.
* recompute → ``[activation_checkpoint] mode`` (selective and op use ``selective_ac_option = "op"``,
  torchtitan's per-op SAC: selective is warned; full:N becomes full, with a warning).
"""
from __future__ import annotations

from autoplan.export.base import Export, Setting, Settings, default_order_warning, uniform_recompute
from autoplan.export.torchtitan import SCHEDULES, SELECTIVE_WARNING, batch_keys, stage_cuts
from autoplan.plan import DEFAULT_ORDER, Plan, recompute_layers
from costmodels.precision import BF16_BYTES, gather_bytes_per_param, is_low_precision

HEAD_MODULE_0_2 = "output"   # 0.2's models name the output projection ``output`` (0.3: ``lm_head``)

TORCHTITAN_VERSION = "0.2.2"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        return "[\n" + "".join(f"    {_toml(v)},\n" for v in value) + "]"     # one row per line
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def to_torchtitan_toml(plan: Plan, *, num_layers: int | None = None, global_batch: int | None = None,
                  seq: int | None = None) -> Export:
    """``plan`` as torchtitan 0.2.x TOML: [parallelism] one group of keys per parallelism, then
    [activation_checkpoint] and [training] (module docstring)."""
    parallelism = (_data_parallel_keys(plan) + _tensor_parallel_keys(plan) + _pipeline_keys(plan, num_layers)
                   + _context_parallel_keys(plan) + _expert_and_order_keys(plan))
    checkpoint = _activation_checkpoint_keys(plan)
    training = _training_keys(plan, global_batch, seq)
    lines = [f"# autoplan plan {plan.to_string()}",
             f"# torchtitan {TORCHTITAN_VERSION} TOML JobConfig (torchtitan/config/job_config.py); "
             "torchtitan 0.3 takes `--to torchtitan`"]
    lines += _table("parallelism", parallelism) + [""] + _table("activation_checkpoint", checkpoint)
    if training.items:
        lines += [""] + _table("training", training)
    tables = _precision_tables(plan)
    for name, keys in tables:
        lines += [""] + _table(name, keys)
    warnings = parallelism.warnings + checkpoint.warnings + tuple(w for _, keys in tables for w in keys.warnings)
    return Export(engine="torchtitan@0.2", text="\n".join(lines) + "\n", warnings=warnings)


def _precision_tables(plan: Plan) -> list[tuple[str, Settings]]:
    """The model converter and its quantize section of a low-precision plan (module docstring)."""
    if not is_low_precision(plan.precision):
        return []
    if plan.precision == "mxfp8":
        return [("model", Settings((Setting("converters", ["quantize.linear.mx"]),))),
                ("quantize.linear.mx", Settings((Setting("recipe_name", "mxfp8_cublas"),
                                                 Setting("filter_fqns", [HEAD_MODULE_0_2]))))]
    keys: tuple[Setting, ...] = (Setting("filter_fqns", [HEAD_MODULE_0_2]),)
    warnings: tuple[str, ...] = ()
    if plan.precision == "fp8-rowwise":
        keys += (Setting("recipe_name", "rowwise"),)
    elif gather_bytes_per_param(plan.precision, plan.zero) < BF16_BYTES:
        keys += (Setting("enable_fsdp_float8_all_gather", True),
                 Setting("precompute_float8_dynamic_scale_for_fsdp", True))
    if plan.precision == "fp8-delayed":
        warnings = ("precision=fp8-delayed (delayed scaling) is not in torchtitan: float8 tensorwise dynamic "
                    "scaling (an amax pass per cast the plan did not price)",)
    return [("model", Settings((Setting("converters", ["quantize.linear.float8"]),))),
            ("quantize.linear.float8", Settings(keys, warnings))]


def _table(name: str, keys: Settings) -> list[str]:
    return [f"[{name}]"] + [f"{k.name} = {_toml(k.value)}" for k in keys.items]


def _data_parallel_keys(plan: Plan) -> Settings:
    """zero 0: DDP over dp; zero 2/3 (and 1, warned): FSDP2 over dp, resharding after forward under zero 3."""
    if plan.zero == 0:
        return Settings((Setting("data_parallel_replicate_degree", plan.dp), Setting("data_parallel_shard_degree", 1)))
    keys = Settings((Setting("data_parallel_replicate_degree", 1), Setting("data_parallel_shard_degree", plan.dp)))
    if plan.dp == 1:
        return keys
    warnings = ("zero=1 has no torchtitan form: FSDP with fsdp_reshard_after_forward = "
                "\"never\" (zero=2: gradients sharded too)",) if plan.zero == 1 else ()
    return keys + Settings((Setting("fsdp_reshard_after_forward", "always" if plan.zero >= 3 else "never"),),
                           warnings)


def _tensor_parallel_keys(plan: Plan) -> Settings:
    warnings = (("sp=off is not expressible: torchtitan always applies sequence parallelism with TP",)
                if plan.tp > 1 and not plan.sp else ())
    return Settings((Setting("tensor_parallel_degree", plan.tp),), warnings)


def _pipeline_keys(plan: Plan, num_layers: int | None) -> Settings:
    """pp, its torch schedule and micro-batch size, and the stage cuts as module FQNs when the
    layer count is known."""
    degree = Settings((Setting("pipeline_parallel_degree", plan.pp),))
    if plan.pp == 1:
        return degree
    keys = degree + Settings((Setting("pipeline_parallel_schedule", SCHEDULES[plan.schedule]),
                              Setting("pipeline_parallel_microbatch_size", plan.mbs)))
    return keys + stage_cuts(plan, num_layers, "module_fqns_per_model_part", head=HEAD_MODULE_0_2)


def _context_parallel_keys(plan: Plan) -> Settings:
    """cp, ring attention passing K/V around the ring (all-to-all rotation); Ulysses/USP run as ring."""
    degree = Settings((Setting("context_parallel_degree", plan.cp),))
    if plan.cp == 1:
        return degree
    warnings = ((f"cp_algo={plan.cp_algo} is not in torchtitan: ring attention "
                 "(context_parallel_rotate_method = \"alltoall\")",) if plan.cp_algo != "ring" else ())
    return degree + Settings((Setting("context_parallel_rotate_method", "alltoall"),), warnings)


def _expert_and_order_keys(plan: Plan) -> Settings:
    """ep (carved out of dp) with the experts split over tp as the plan prices them (etp = tp), and a
    warning when the plan's axis order is not torchtitan's."""
    order = default_order_warning(plan, "torchtitan", DEFAULT_ORDER)
    keys: tuple[Setting, ...] = (Setting("expert_parallel_degree", plan.ep),)
    if plan.ep > 1 and plan.tp > 1:
        keys += (Setting("expert_tensor_parallel_degree", plan.tp),)
    return Settings(keys, (order,) if order else ())


def _activation_checkpoint_keys(plan: Plan) -> Settings:
    """The plan's one recompute mode (``uniform_recompute``); full:N, which torchtitan lacks, runs as full."""
    mode, note = uniform_recompute(plan)
    warnings: tuple[str, ...] = (note,) if note else ()
    if recompute_layers(mode) is not None:
        warnings += (f"recompute={mode} (the first N layers of each stage) is not in torchtitan: "
                     "mode = \"full\" on every layer",)
        mode = "full"
    if mode == "selective":
        warnings += (SELECTIVE_WARNING,)
    keys: tuple[Setting, ...] = (Setting("mode", "selective" if mode == "op" else mode),)
    if mode in ("selective", "op"):
        keys += (Setting("selective_ac_option", "op"),)
    return Settings(keys, warnings)


def _training_keys(plan: Plan, global_batch: int | None, seq: int | None) -> Settings:
    """Batch sizes (a rank's local batch is its share of the global one under pp, else one micro-batch)
    and the sequence length, where given."""
    return Settings(batch_keys(plan, global_batch, seq, ""))
