"""A plan as a torchtitan TOML fragment ([parallelism], [activation_checkpoint], [training]).

Targets torchtitan's TOML ``JobConfig``, ``torchtitan/config/job_config.py`` at commit
6404b932421f5ce382e7dac5ad381b2c17b1373c (key names checked against that file).
Later torchtitan main replaced the TOML JobConfig by Python configs
(``ParallelismConfig``: ``pipeline_parallel_module_fqns_per_model_part``,
``num_pp_microbatches``, ``enable_sequence_parallel``); this exporter does not
target that.

Mapping (plan → key):

* dp: zero 2/3 → ``data_parallel_shard_degree`` = dp (FSDP2) with
  ``fsdp_reshard_after_forward`` "never" (zero 2) / "always" (zero 3); zero 0 →
  ``data_parallel_replicate_degree`` = dp (DDP); zero 1 has no torchtitan form and
  runs as zero 2 (warned).
* tp → ``tensor_parallel_degree`` (torchtitan always adds sequence parallelism and
  loss parallelism with TP; sp=off is warned).
* pp → ``pipeline_parallel_degree``, schedule → ``pipeline_parallel_schedule``
  (torch names), mbs → ``pipeline_parallel_microbatch_size``; stage cuts →
  ``module_fqns_per_model_part`` with the module names of torchtitan's decoder
  models (``tok_embeddings``, ``layers.N``, ``norm``, ``output``).
* cp → ``context_parallel_degree``; ring → ``context_parallel_rotate_method`` =
  "alltoall" (KV passed around the ring); Ulysses/USP have no torchtitan form (warned).
* ep → ``expert_parallel_degree`` (carved out of dp, as torchtitan's dp2ep).
* recompute → ``[activation_checkpoint] mode`` (selective and op use ``selective_ac_option = "op"``;
  full:N becomes full, with a warning).
"""
from __future__ import annotations

from autoplan.export.base import Export, default_order_warning, stage_layers, uniform_recompute
from autoplan.plan import recompute_layers
from autoplan.plan import DEFAULT_ORDER, Plan

TORCHTITAN_COMMIT = "6404b932421f5ce382e7dac5ad381b2c17b1373c"
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zb-h1": "InterleavedZeroBubble",
    "zb-h2": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}


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


def model_parts(layers: tuple[int, ...]) -> list[list[str]]:
    """Module FQNs of each model chunk: embedding with the first, norm and head with the last."""
    parts, start = [], 0
    for i, n in enumerate(layers):
        part = [f"layers.{k}" for k in range(start, start + n)]
        if i == 0:
            part.insert(0, "tok_embeddings")
        if i == len(layers) - 1:
            part += ["norm", "output"]
        parts.append(part)
        start += n
    return parts


def to_torchtitan(plan: Plan, *, num_layers: int | None = None, global_batch: int | None = None,
                  seq: int | None = None) -> Export:
    warnings: list[str] = []
    par: dict[str, object] = {}
    if plan.zero == 0:
        par["data_parallel_replicate_degree"] = plan.dp
        par["data_parallel_shard_degree"] = 1
    else:
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = plan.dp
        if plan.dp > 1:
            par["fsdp_reshard_after_forward"] = "always" if plan.zero >= 3 else "never"
            if plan.zero == 1:
                warnings.append("zero=1 has no torchtitan form: FSDP with fsdp_reshard_after_forward = "
                                "\"never\" (zero=2: gradients sharded too)")
    par["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1 and not plan.sp:
        warnings.append("sp=off is not expressible: torchtitan always applies sequence parallelism with TP")
    par["pipeline_parallel_degree"] = plan.pp
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[plan.schedule]
        par["pipeline_parallel_microbatch_size"] = plan.mbs
        if plan.schedule == "zb-h2":
            warnings.append("schedule=zb-h2 is not in torch pipelining: InterleavedZeroBubble "
                            "(ZB1P, one model chunk per rank)")
        layers = stage_layers(plan, num_layers)
        if layers is not None:
            par["module_fqns_per_model_part"] = model_parts(layers)
        else:
            warnings.append("stage cuts left to torchtitan (its default split) because the layer "
                            "count is unknown: pass --model to pin them")
    par["context_parallel_degree"] = plan.cp
    if plan.cp > 1:
        par["context_parallel_rotate_method"] = "alltoall"
        if plan.cp_algo != "ring":
            warnings.append(f"cp_algo={plan.cp_algo} is not in torchtitan: ring attention "
                            "(context_parallel_rotate_method = \"alltoall\")")
    par["expert_parallel_degree"] = plan.ep
    order = default_order_warning(plan, "torchtitan", DEFAULT_ORDER)
    if order:
        warnings.append(order)

    mode, note = uniform_recompute(plan)
    if note:
        warnings.append(note)
    if recompute_layers(mode) is not None:
        warnings.append(f"recompute={mode} (the first N layers of each stage) is not in torchtitan: "
                        "mode = \"full\" on every layer")
        mode = "full"
    ac: dict[str, object] = {"mode": "selective" if mode == "op" else mode}
    if mode in ("selective", "op"):
        ac["selective_ac_option"] = "op"

    training: dict[str, object] = {}
    if global_batch is not None:
        per_dp = global_batch // plan.dp
        training["local_batch_size"] = per_dp if plan.pp > 1 else plan.mbs
        training["global_batch_size"] = global_batch
    if seq is not None:
        training["seq_len"] = seq

    lines = [f"# autoplan plan {plan.to_string()}",
             f"# torchtitan TOML JobConfig (torchtitan/config/job_config.py @ {TORCHTITAN_COMMIT[:12]})",
             "[parallelism]"]
    lines += [f"{k} = {_toml(v)}" for k, v in par.items()]
    lines += ["", "[activation_checkpoint]"] + [f"{k} = {_toml(v)}" for k, v in ac.items()]
    if training:
        lines += ["", "[training]"] + [f"{k} = {_toml(v)}" for k, v in training.items()]
    return Export(engine="torchtitan", text="\n".join(lines) + "\n", warnings=tuple(warnings))
