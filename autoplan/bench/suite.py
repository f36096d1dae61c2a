"""The benchmark cases: which model, on which cluster, at which sequence length and batch.

Every choice is stated in ``Case.why`` and printed in the results table.  Global batches
follow the published runs where there is one (GPT-3: 1,536 × 2K; Llama 3 405B: 16M tokens
at 8K; DeepSeek-V3: 15,360 × 4K; Megatron SC21's 1T GPT: 3,072 × 2K) and otherwise keep
the tokens per step in the same range (8M tokens for the long-context runs).  Where the
GPU count is not a power of two (NVL72: 2,304 = 2⁸·9), the batch is a multiple of the GPU
count so that every recipe can divide it over its data-parallel ranks.

``grid_cp`` is the context-parallel degrees the Megatron grid may use: 1, and for the
long-context cases the powers of two up to the degree the Llama 3 recipe picks (seq/8K).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from autoplan.errors import UserError


@dataclass(frozen=True)
class Case:
    name: str                   # unique, used for the per-case cache file and ``--cases``
    group: str                  # dense | moe | long-context | nvl72 | a100 | quick
    model: str                  # zoo name or family spec (``autoplan.frontend.trace``)
    cluster: str                # cluster name, shorthand or YAML path
    seq: int                    # tokens per sequence
    global_batch: int           # sequences per optimizer step
    why: str                    # where the batch (and anything unusual) comes from
    grid_cp: tuple[int, ...] = (1,)

    @property
    def tokens_per_step(self) -> int:
        return self.seq * self.global_batch

    def to_dict(self) -> dict:
        d = asdict(self)
        d["grid_cp"] = list(self.grid_cp)
        return d


_CP_128K = (1, 2, 4, 8, 16)
_CP_32K = (1, 2, 4)

DEFAULT: tuple[Case, ...] = (
    Case("gpt3-175b-h100x1024", "dense", "gpt3-175b", "h100x1024", 2048, 1536,
         "GPT-3 paper: 1,536 sequences × 2K = 3.1M tokens"),
    Case("llama3-70b-h100x1024", "dense", "llama3-70b", "h100x1024", 8192, 1024,
         "8K context as Llama 3; 1,024 × 8K = 8.4M tokens (8K tokens per GPU)"),
    Case("llama3-405b-h100x8192", "dense", "llama3-405b", "h100x8192", 8192, 2048,
         "Llama 3 report: 16M tokens per step at 8K (2,048 sequences)"),
    Case("llama3-405b-h100x16384", "dense", "llama3-405b", "h100x16384", 8192, 2048,
         "Llama 3 report's 16K-GPU run: 2,048 × 8K = 16.8M tokens; 3,072-GPU pods, 1:7 above"),
    Case("mixtral-8x22b-h100x512", "moe", "mixtral-8x22b", "h100x512", 4096, 1024,
         "4K context, 1,024 × 4K = 4.2M tokens (not published; a typical MoE pre-training batch)"),
    Case("deepseek-v3-h100x2048", "moe", "deepseek-v3", "h100x2048", 4096, 15360,
         "DeepSeek-V3 report: 15,360 × 4K = 63M tokens on 2,048 GPUs (H800 there)"),
    Case("llama3-8b-32k-h100x256", "long-context", "llama3-8b", "h100x256", 32768, 256,
         "32K context, 256 × 32K = 8.4M tokens", _CP_32K),
    Case("llama3-8b-128k-h100x256", "long-context", "llama3-8b", "h100x256", 131072, 64,
         "128K context, 64 × 128K = 8.4M tokens", _CP_128K),
    Case("llama3-70b-128k-h100x1024", "long-context", "llama3-70b", "h100x1024", 131072, 64,
         "128K context, 64 × 128K = 8.4M tokens", _CP_128K),
    Case("llama3-405b-gb200x2304", "nvl72", "llama3-405b", "gb200x2304", 8192, 2304,
         "2,304 × 8K = 18.9M tokens: one sequence per GPU (2,304 = 2⁸·9 GPUs; 2,048 would forbid "
         "most data-parallel degrees)"),
    Case("deepseek-v3-gb200x2304", "nvl72", "deepseek-v3", "gb200x2304", 4096, 13824,
         "13,824 × 4K = 57M tokens: the multiple of 2,304 GPUs nearest DeepSeek-V3's 15,360"),
    Case("gpt-1t-a100x3072", "a100", "gpt-1t", "a100x3072", 2048, 3072,
         "Megatron SC21 Table 1's 1T run: 3,072 × 2K on 3,072 A100 (DGX-A100-like, 8× HDR 200G)"),
)

# Small cases for the tests: seconds each on 2 cores.  The second one is designed to fail
# (a 53B-parameter, 4-layer model on 8 GPUs cannot hold its model states even with ZeRO-3),
# so that the tests see the suite go on after a failure.
QUICK: tuple[Case, ...] = (
    Case("gpt-1.7b-h100x64", "quick", "gpt-1.7b", "h100x64", 2048, 256,
         "SC21 Table 1's 1.7B model, 256 × 2K"),
    Case("does-not-fit-h100x8", "quick", "gpt:layers=4,hidden=32768,heads=64,vocab=51200",
         "h100x8", 2048, 8, "designed to fail: 53B parameters do not fit on 8 GPUs even with ZeRO-3"),
    Case("tiny-moe-h100x64", "quick",
         "moe:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=4096,vocab=32000,experts=8,topk=2,moe_ffn=2048",
         "h100x64", 2048, 256, "a 0.5B-parameter, 8-expert top-2 MoE, 256 × 2K"),
    Case("llama-1b-32k-h100x64", "quick",
         "llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256",
         "h100x64", 32768, 32, "a Llama-3.2-1B-like model at 32K, 32 × 32K = 1M tokens", _CP_32K),
)

SUITES: dict[str, tuple[Case, ...]] = {"default": DEFAULT, "quick": QUICK}


def select(suite: str, names: list[str] | None = None) -> tuple[Case, ...]:
    """The cases of ``suite``, or only those named (in suite order); UserError on a bad name."""
    if suite not in SUITES:
        raise UserError(f"unknown suite {suite!r}", f"choose one of: {', '.join(SUITES)}")
    cases = SUITES[suite]
    if not names:
        return cases
    known = {c.name for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown case{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                        f"in suite {suite!r}", f"choose from: {', '.join(c.name for c in cases)}")
    wanted = set(names)
    return tuple(c for c in cases if c.name in wanted)
