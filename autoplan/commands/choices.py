"""The values the parser shows (defaults, choices, recipe summaries), without importing the
modules that own them: ``autoplan --help`` and a usage error must not wait for numpy, the cost
model or torch (issue 37: < 1 s on an idle 2-core machine).  Each value is a copy of its owner's;
``tests/autoplan/commands/test_choices.py`` checks every one against it, so a change at the owner
fails there instead of drifting here.  Import nothing heavy into this module."""
from __future__ import annotations

DEFAULT_SEQ = 2048                        # autoplan.workload
DEFAULT_GLOBAL_BATCH = 1024               # autoplan.workload
DEFAULT_SAMPLES = 24                      # autoplan.cost.uncertainty

# autoplan.cost.EstimateOptions() field defaults, by field name
ESTIMATE_DEFAULTS = {"solver": "cpsat", "time_limit_s": 30.0, "fsdp_prefetch": 1, "grad_reduce_bytes": 4.0,
                     "state_precision": "megatron", "kernels": "eager", "fp8_engine": "transformer-engine",
                     "attention_kernel": "profile", "fp8_recompute": "fp8", "loss_kernel": "eager"}
GRAD_SYNCS = ("microbatch", "step")       # autoplan.cost.types
KERNELS = ("eager", "megatron-core")      # autoplan.cost.types
FP8_ENGINES = ("transformer-engine", "torchao")   # autoplan.cost.types
FP8_RECOMPUTES = ("fp8", "bf16")          # autoplan.cost.types
LOSS_KERNELS = ("eager", "fused")         # autoplan.cost.types
ATTENTION_KERNELS = ("profile", "fa2", "cudnn", "fa3")   # costmodels.attention
DEFAULT_MARGIN_GIB = 4.0                  # autoplan.cost.types
BACKENDS = ("cpsat", "cbc")               # autoplan.sharding.ilp
STATE_PRECISION_NAMES = ("megatron", "apex-dfa-bf16", "megatron-bf16-grads")   # costmodels.memory

OBJECTIVES = ("point", "p50", "p90", "regret")          # autoplan.search.robust
DEFAULT_OBJECTIVE = "regret"                            # autoplan.search.robust

ALLOCATORS = ("classic", "expandable")    # autoplan.apply.memcheck.ALLOCATORS' names

SUMMARIES = {                             # autoplan.baselines.SUMMARIES
    "megatron": "TP = NVLink domain, SP, smallest PP that fits, DP rest, interleaved 1F1B, selective recompute, "
                "ZeRO-1",
    "megascale": "TP 8 in NVLink, PP across IB, DP outermost (order tp-cp-ep-pp-dp), ZeRO-1, interleaved, selective",
    "llama3": "TP 8, CP seq/8K when seq ≥ 32K, smallest PP ≤ 16 that fits, FSDP (ZeRO-2) DP outermost",
    "fsdp": "ZeRO-3 over all GPUs (no TP/PP/CP), least recomputation and largest micro-batch that fit",
    "deepseek": "MoE: PP 16 with DualPipeV, 64-way EP across nodes, TP 1, ZeRO-1",
    "published": "the layout a published run used (GPT-3/MegaScale, Llama 3 405B, DeepSeek-V3, Nemotron-4, Mixtral)",
}

STUDY_QUESTIONS = {                       # autoplan.study.QUESTIONS
    "q1": "auto vs hand-written 4D at 100B+ and > 1K GPUs, published layouts as hand baselines",
    "q2": "where FSDP/ZeRO-3 alone stops being enough: MFU ceiling and break-point",
    "q3": "when sequence parallelism (with selective recompute) stops being optional",
    "q4": "ring vs Ulysses vs USP: break-points by sequence, heads and NVLink/IB ratio",
    "q5": "can recomputation replace SP/CP at long context; when CP becomes necessary or faster",
}
