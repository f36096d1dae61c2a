"""What Megatron-LM's argument parser and ``validate_args`` enforce on the flags autoplan emits,
written from Megatron's source and independent of ``autoplan.export.megatron``.

Source: NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22).  ``A:n`` is
line n of megatron/training/arguments.py, ``TC:n`` of megatron/core/transformer/transformer_config.py
(its ``__post_init__`` runs when the model is built from the same args), ``L:n`` of
megatron/core/transformer/pipeline_parallel_layer_layout.py, ``MB:n`` of
megatron/core/num_microbatches_calculator.py.  Megatron is not installed here (it needs CUDA,
Transformer Engine and Apex to import); ``check(argv, world_size=…, model=…)`` returns the assertions
the arguments would fail, each with its source line, [] when Megatron would accept them.  ``model``
holds what the user's own model flags give (num_layers when not in argv, num_experts).
"""
from __future__ import annotations

import re
import shlex
from types import SimpleNamespace

# flag → (dest, kind); kind: "int", "str", "store_true", "ints" (nargs +), "strs" (nargs +) or a tuple of
# choices.  Flags built from dataclasses by ArgumentGroupFactory (megatron/training/argument_utils.py:
# "--" + name with "_" → "-", bool False → store_true) are cited by their dataclass field.
FLAGS = {
    "--num-layers": ("num_layers", "int"),                                  # TransformerConfig.num_layers, TC:65
    "--seq-length": ("seq_length", "int"),                                  # A:3305
    "--bf16": ("bf16", "store_true"),                                       # ModelParallelConfig.bf16
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", "int"),  # ModelParallelConfig
    "--sequence-parallel": ("sequence_parallel", "store_true"),             # ModelParallelConfig
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", "int"),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", "str"),              # A:3103
    "--num-layers-per-virtual-pipeline-stage": ("num_layers_per_virtual_pipeline_stage", "int"),  # A:3114
    "--num-virtual-stages-per-pipeline-rank": ("num_virtual_stages_per_pipeline_rank", "int"),    # A:3116
    "--context-parallel-size": ("context_parallel_size", "int"),
    "--cp-comm-type": ("cp_comm_type", "strs"),                             # A:3221 (nargs +)
    "--hierarchical-context-parallel-sizes": ("hierarchical_context_parallel_sizes", "ints"),  # list[int]
    "--expert-model-parallel-size": ("expert_model_parallel_size", "int"),
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", "int"),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", ("allgather", "alltoall", "flex")),  # TC:891
    "--moe-flex-dispatcher-backend": ("moe_flex_dispatcher_backend", ("deepep", "hybridep")),  # TC MoE
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", "store_true"),
    "--delay-wgrad-compute": ("delay_wgrad_compute", "store_true"),
    "--use-distributed-optimizer": ("use_distributed_optimizer", "store_true"),  # A:3156
    "--use-megatron-fsdp": ("use_megatron_fsdp", "store_true"),             # training/config/common_config.py:92
    "--data-parallel-sharding-strategy": ("data_parallel_sharding_strategy",  # A:3190
                                          ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--ckpt-format": ("ckpt_format", ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor")),  # training_config.py:486
    "--recompute-granularity": ("recompute_granularity", ("full", "selective")),   # TC:532
    "--recompute-method": ("recompute_method", ("uniform", "block")),              # TC:543
    "--recompute-num-layers": ("recompute_num_layers", "int"),                     # TC:551
    "--micro-batch-size": ("micro_batch_size", "int"),                      # training_config.py:11
    "--global-batch-size": ("global_batch_size", "int"),                    # training_config.py:15
    "--use-tp-pp-dp-mapping": ("use_tp_pp_dp_mapping", "store_true"),       # common_config.py:105
    "--fp8-format": ("fp8", ("e4m3", "hybrid")),                            # TransformerConfig.fp8, TC:587
    "--fp8-recipe": ("fp8_recipe", ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),  # TC:594
    "--fp8-param-gather": ("fp8_param_gather", "store_true"),               # A:2016
    "--fp8-param": ("fp8_param", "store_true"),                             # TransformerConfig.fp8_param, TC:602
    # MLATransformerConfig (megatron/core/transformer/transformer_config.py) and --mtp-num-layers
    "--multi-latent-attention": ("multi_latent_attention", "store_true"),
    "--q-lora-rank": ("q_lora_rank", "int"),
    "--kv-lora-rank": ("kv_lora_rank", "int"),
    "--qk-head-dim": ("qk_head_dim", "int"),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", "int"),
    "--v-head-dim": ("v_head_dim", "int"),
    "--mtp-num-layers": ("mtp_num_layers", "int"),
}
DEFAULTS = dict(num_layers=None, seq_length=None, bf16=False, tensor_model_parallel_size=1, sequence_parallel=False,
                pipeline_model_parallel_size=1, pipeline_model_parallel_layout=None,
                num_layers_per_virtual_pipeline_stage=None, num_virtual_stages_per_pipeline_rank=None,
                context_parallel_size=1, cp_comm_type=["p2p"], hierarchical_context_parallel_sizes=None,
                expert_model_parallel_size=1, expert_tensor_parallel_size=None,
                moe_token_dispatcher_type="allgather", moe_flex_dispatcher_backend="deepep",
                overlap_moe_expert_parallel_comm=False,
                delay_wgrad_compute=False, use_distributed_optimizer=False, use_megatron_fsdp=False,
                data_parallel_sharding_strategy="optim_grads_params", ckpt_format="torch_dist",
                recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                micro_batch_size=None, global_batch_size=None, use_tp_pp_dp_mapping=False,
                overlap_p2p_comm=True,            # A:3118, --no-overlap-p2p-communication is store_false
                transformer_impl="transformer_engine",   # TC:1314
                fp8=None, fp8_recipe="delayed", fp8_param_gather=False, fp8_param=False,
                multi_latent_attention=False, q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128,
                qk_pos_emb_head_dim=64, v_head_dim=128, mtp_num_layers=None)


def command_words(text: str) -> list[str]:
    """The arguments of an exported Megatron command (comment lines dropped, continuations joined)."""
    body = [line.rstrip().rstrip("\\") for line in text.splitlines() if not line.startswith("#")]
    return shlex.split(" ".join(body))


def parse(argv: list[str]) -> SimpleNamespace:
    """argparse's reading of ``argv``; ValueError on what argparse itself rejects."""
    args = SimpleNamespace(**DEFAULTS)
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag not in FLAGS:
            raise ValueError(f"argparse: unrecognized argument {flag}")
        dest, kind = FLAGS[flag]
        if kind == "store_true":
            setattr(args, dest, True)
            i += 1
            continue
        values = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values.append(argv[i + 1])
            i += 1
        i += 1
        many = kind in ("ints", "strs")
        if not values or (len(values) > 1 and not many):
            raise ValueError(f"argparse: {flag} expects {'one or more values' if many else 'one value'}, got {values}")
        if isinstance(kind, tuple) and values[0] not in kind:
            raise ValueError(f"argparse: {flag}: invalid choice {values[0]!r} (choose from {kind})")
        convert = int if kind in ("int", "ints") else str
        try:
            converted = [convert(v) for v in values]
        except ValueError:
            raise ValueError(f"argparse: {flag}: invalid {kind} value {values}") from None
        setattr(args, dest, converted if many else converted[0])
    return args


def check(argv: list[str], *, world_size: int, model: dict | None = None) -> list[str]:
    """The assertions ``argv`` fails (source line: message); [] when Megatron accepts it."""
    try:
        a = parse(argv)
    except ValueError as e:
        return [str(e)]
    model = model or {}
    if a.num_layers is None:
        a.num_layers = model.get("num_layers")
    a.num_experts = model.get("num_experts")
    a.world_size = world_size
    return [f"{where}: {message}" for where, ok, message in _rules(a) if not ok]


def _rules(a: SimpleNamespace):
    """(source, holds, message) for every constraint on the flags above, in validate_args' order."""
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    yield "A:432", a.world_size % (tp * pp * cp) == 0, "world size not divisible by tp·pp·cp"
    dp = a.world_size // (tp * pp * cp)                                          # A:448
    hierarchical = a.hierarchical_context_parallel_sizes
    if hierarchical:
        yield "A:582", _product(hierarchical) == cp, "context_parallel_size != prod(hierarchical sizes)"
    if "a2a+p2p" in a.cp_comm_type:
        yield "A:583", hierarchical is not None, "a2a+p2p needs --hierarchical-context-parallel-sizes"
    for comm in a.cp_comm_type:
        yield "A:3221", comm in ("p2p", "a2a", "allgather", "a2a+p2p"), f"unknown cp comm type {comm}"
    etp = a.expert_tensor_parallel_size or tp                                    # A:587-588
    yield "A:694", a.micro_batch_size is not None and a.micro_batch_size > 0, "micro batch size must be > 0"
    if a.global_batch_size is not None and a.micro_batch_size:
        yield "MB:381", a.global_batch_size % (a.micro_batch_size * dp) == 0, \
            "global batch not divisible by micro batch × data-parallel size"
    yield from _pipeline_rules(a, pp)
    yield from _fp8_rules(a)
    if a.use_megatron_fsdp:
        yield "A:1169", a.ckpt_format == "fsdp_dtensor", "Megatron-FSDP requires the fsdp_dtensor checkpoint format"
    if a.ckpt_format == "fsdp_dtensor":
        yield "A:1676", a.use_megatron_fsdp, "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP"
    if a.seq_length is not None and cp > 1:
        yield "A:1336", a.seq_length % (2 * cp) == 0, "seq-length must be a multiple of 2·cp"
    yield from _recompute_rules(a)
    if a.expert_model_parallel_size > 1:
        yield "A:1656", a.num_experts is not None, "expert parallelism needs num_experts"
        if a.num_experts is not None:
            yield "A:1657", a.num_experts % a.expert_model_parallel_size == 0, "num_experts % ep != 0"
        yield "parallel_state expert grid", a.world_size % (etp * a.expert_model_parallel_size * pp) == 0, \
            "world size not divisible by etp·ep·pp"
    if a.moe_token_dispatcher_type == "flex":
        yield "MoEFlexTokenDispatcher", tp * a.expert_model_parallel_size > 1, "flex dispatcher requires TPxEP > 1"
    yield from _overlap_rules(a, pp)


def _pipeline_rules(a: SimpleNamespace, pp: int):
    """A:928-1010 and the layout's own checks (L:41-109)."""
    vpp_args = [a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
                a.pipeline_model_parallel_layout]
    yield "A:928", sum(v is not None for v in vpp_args) <= 1, "more than one virtual-pipeline argument"
    a.vpp = None
    if a.pipeline_model_parallel_layout is not None:
        stages = layout_stages(a.pipeline_model_parallel_layout)
        yield "A:945", len(stages) % pp == 0, "layout stages not divisible by pp"
        a.vpp = len(stages) // pp if len(stages) // pp > 1 else None
        flat = [c for stage in stages for c in stage]
        yield "L:97", flat[:1] == ["E"], "the first layer must be embedding"
        yield "L:100", flat[-1:] == ["L"], "the last layer must be loss"
        yield "L:102-104", flat.count("E") == 1 and flat.count("L") == 1, "embedding and loss exactly once each"
        if a.num_layers is not None:
            yield "L:109", flat.count("t") == a.num_layers, "layout's decoder layers != num_layers"
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        per_stage, rem = divmod(a.num_layers, pp) if a.num_layers is not None else (0, 0)
        yield "A:968", rem == 0, "number of layers must be divisible by pp"
        yield "A:972", per_stage % a.num_layers_per_virtual_pipeline_stage == 0, \
            "layers per pipeline stage not divisible by layers per virtual stage"
        a.vpp = per_stage // a.num_layers_per_virtual_pipeline_stage or None
        a.vpp = a.vpp if a.vpp != 1 else None
    elif a.num_virtual_stages_per_pipeline_rank is not None:
        a.vpp = a.num_virtual_stages_per_pipeline_rank if a.num_virtual_stages_per_pipeline_rank != 1 else None
    elif a.num_layers is not None:
        yield "A:998", a.num_layers % pp == 0, "number of layers should be divisible by pp"
    if a.vpp is not None:
        yield "A:1000", pp > 1 if a.overlap_p2p_comm else pp > 2, "interleaving needs pp > 1 (> 2 without p2p overlap)"


def _fp8_rules(a: SimpleNamespace):
    """A:1095-1097 (FP8 parameter gathers) and TC:1527-1567 (what FP8 mode refuses), and that a recipe
    only takes effect with a format (``--fp8-recipe`` alone leaves TransformerConfig.fp8 None: BF16)."""
    if a.fp8_param_gather:
        yield "A:1096", a.use_distributed_optimizer or a.use_megatron_fsdp, \
            "--fp8-param-gather only with the distributed optimizer or (Megatron) FSDP"
    if a.fp8 is not None and a.fp8_recipe == "custom":
        yield "TC:1558", False, "fp8_recipe custom needs --fp8-quantizer-factory"
    yield "TC:1566", not a.fp8_param or a.fp8 is not None, "fp8_param must be used together with fp8 mode"
    yield "TC:587", a.fp8 is not None or (not a.fp8_param_gather and a.fp8_recipe == "delayed"), \
        "an FP8 recipe or FP8 gathers without --fp8-format: Megatron trains in BF16"


def _recompute_rules(a: SimpleNamespace):
    """A:1425-1428 and TC:1901-1931."""
    if a.recompute_granularity == "selective":
        yield "A:1427", a.recompute_method is None, "selective recompute takes no --recompute-method"
        yield "TC:1927", a.recompute_num_layers is None, "selective recompute takes no --recompute-num-layers"
    if a.recompute_granularity == "full":
        yield "TC:1913", a.recompute_method is not None, "full recompute needs --recompute-method block|uniform"
        yield "TC:1919", a.recompute_num_layers is not None, "full recompute needs --recompute-num-layers"


def _overlap_rules(a: SimpleNamespace, pp: int):
    """TC:3002-3077 (the EP all-to-all overlap and the delayed weight gradients) and A:1903-1905."""
    if a.overlap_moe_expert_parallel_comm:
        if pp > 1:
            yield "TC:3008", a.vpp is not None, "EP A2A overlap needs virtual pipeline stages under pp > 1"
        yield "TC:3013", a.expert_model_parallel_size > 1, "EP A2A overlap needs expert parallelism"
        yield "TC:3017", a.moe_token_dispatcher_type in ("alltoall", "flex"), "EP A2A overlap needs alltoall/flex"
        yield "TC:3021", a.recompute_granularity != "full", "EP A2A overlap refuses full recomputation"
        yield "TC:3024", a.recompute_method is None, "EP A2A overlap refuses a recompute method"
        yield "TC:3027", a.recompute_num_layers is None, "EP A2A overlap refuses recompute_num_layers"
        yield "TC:3035", a.bf16, "EP A2A overlap needs bf16 or fp16"
    if a.delay_wgrad_compute:
        yield "A:1904", a.transformer_impl == "transformer_engine", "delay_wgrad_compute needs transformer_engine"
        yield "TC:3075", a.overlap_moe_expert_parallel_comm, "delay_wgrad_compute needs the EP A2A overlap"


def layout_stages(text: str) -> list[list[str]]:
    """``PipelineParallelLayerLayout.parse_str_to_list`` (L:283-321): commas dropped, ``(..)*n`` and
    ``x*n`` unrolled, stages split by ``|``."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(stage) for stage in text.split("|")]
    assert all(c in "ELtm" for stage in stages for c in stage), f"invalid layer character in {text}"
    return stages


def _product(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out
