"""The public rows of ``regimes3_public.json`` (schedules, context parallelism, MoE, FP8), priced
where the planner can write them, and the reason where it cannot.

Read by ``experiments/validate_published.py --regimes`` and ``--cv``.  Each row becomes a
``published_regimes.RegimeRow`` (its regime, source and the plan string the project parses) or an
``Unexpressible`` record naming what the grammar or the pricing lacks (an ``edp`` that
contradicts tp·cp·dp = etp·ep·edp).  USP rows keep their ``ulysses=U,ring=R`` split (the plan grammar's).  FP8 rows
carry the recipe their software ran (``FP8_RECIPE``) as the plan's ``precision``.

The measured figure becomes seconds per step, in this order: the row's ``derived.iter_s``;
``global_batch / samples_per_s``; ``global_batch · seq / (tokens_per_s_per_gpu · GPUs)``; else
``FLOPs per step / (tflops_per_gpu · GPUs)`` with the source's own FLOP convention
(``regimes3_public.md``): the USP paper counts causal attention work, NeMo's long-sequence page
the full s², both over the matmuls of the model (``model_flops_per_token``).

Zero Bubble's interleaved rows (1F1B-I) run "the maximum number of chunks, each transformer layer
one chunk" with layers = k·p − 2, the first and the last virtual stage one layer fewer
(``regimes3_public.md``'s caveat; the row's ``vpp`` is k, the chunks per rank).  The row's plan
gets that layout as ``layers=``, derived from its own numbers: c = (layers + 2) / (pp·vpp) layers
per chunk (1 in every row), the first virtual stage c − 1 (the embedding and c − 1 layers) and
the last c − 1 (c − 1 layers, the head and the loss), e.g. ``layers=0-1x22-0`` for 22 layers on
pp = 8 with vpp = 3 — Llama 3's layout (``published_regimes.RUN_SETTINGS``).

Zero Bubble's split-backward rows (ZB-1p as ``zb-h1``, ZB-2p as ``zb-h2``) ran the sail-sg fork
with optimizer post-validation (the caveat; the ZB-2p notes: "~8% slower with the usual
all-reduce sync"): they are priced with ``EstimateOptions(post_validation=True)``; its 1F1B and
1F1B-I baselines are Megatron-LM's synchronous optimizer step (where rank 0 starts first and
ends last, as there, the two agree anyway).  The fork splits the backward with Megatron's
``WeightGradStore`` (each linear's backward stores its input and output gradient for W; B frees
everything else): ``EstimateOptions(wgrad_store=True)``.  The model is what the fork's script ran
(``ZERO_BUBBLE_MODEL``: eager attention, a SentencePiece vocabulary).

MoE parallel folding (Megatron-Core model zoo and Megatron-Bridge rows): a row's ``etp`` is the
plan's ``etp`` (``autoplan.plan``: attention on tp·cp·dp, experts on etp·ep·edp of a stage's
GPUs); its ``edp`` is derived by the plan, so the adapter checks the row's against
tp·cp·dp / (etp·ep) and refuses the row, saying so, where they disagree (none do: xnode-ep32
tp2·dp16 = ep32·edp1; inode-ep8-fsdp tp2·dp128 = ep8·edp32; pp32 tp2·dp4 = ep8·edp1; tp4-pp8
tp4·dp8 = ep8·edp4).  A Megatron-stack row without ``etp`` whose ep does not divide dp
(Megatron-Bridge's Qwen3-235B, tp2·pp8·dp16 ep32) cannot have run with Megatron-Core's default
etp = tp: etp·ep·pp = 2·32·8 = 512 > 256 GPUs, which ``initialize_model_parallel`` refuses
(parallel_state.py L880-884); it ran folded with the largest etp dividing tp that fits,
``folded_etp`` (here 1: tp·cp·dp / ep = 1).

Megatron-Core rows (the model zoo's and Megatron-Bridge's) whose layers do not split evenly over
pp·vpp (Qwen3-235B: 94 layers on 32 or 96 virtual stages; Llama 3.1 405B: 126 on 64) ran with the
embedding and the loss counted as one layer each
(``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``, the only
even split of 94 + 2 over 32 and 96 stages and of 126 + 2 over 64, and what Megatron-Bridge's
``llama31_405b_pretrain_config`` sets): c = (layers + 2) / (pp·vpp) per stage, the first
stage the embedding and c − 1 layers, the last c − 1 layers and the loss — ``uneven_layers``'s
formula, e.g. ``layers=0-1x94-0`` for pp32·vpp3, ``2-3x30-2`` for pp8·vpp4 and ``1-2x62-1`` for
pp8·vpp8.

Clusters: ``<gpu>x<N>`` shorthand of the row's GPU kind; A800 rows (``gpu: other``) are the A100
80GB reference system with NVLink capped at 400 GB/s, 200 GB/s per direction (the export-control
part: same silicon, fewer NVLink lanes).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

import published_regimes as pr
from autoplan.errors import UserError
from autoplan.plan import Plan
from costmodels.pipeline import SPLIT_BACKWARD

PATH = os.path.join(pr.REFERENCE, "regimes3_public.json")
SOURCE_OF_PREFIX = {"zb-": "zero-bubble", "usp-": "usp", "nemo-": "nemo-longseq", "mcore-": "mcore-zoo",
                    "mb-": "megatron-bridge", "fp8lm-": "fp8-lm", "llmfoundry-": "llm-foundry"}
GPU_SHORTHAND = {"a100-80gb": "a100", "h100": "h100", "b200": "b200", "other": "a800"}
GPT_VOCAB = 50304
"""Vocabulary of a ``gpt:`` row that does not publish one (Zero Bubble, FP8-LM): the GPT-2 BPE
padded to a multiple of 128, Megatron-LM's default tokenizer setting (an assumption)."""
ZERO_BUBBLE_MODEL = {"attention": "eager", "vocab": 32000}
"""What the Zero Bubble rows' model ran as, from the fork's own launch script of the paper's time
(sail-sg/zero-bubble-pipeline-parallelism ``examples/pretrain_zero_bubble.sh`` at 425b42e5,
2023-11-17: seq 1024, layers = 4·p − 2, hidden 4096, ``--fp16``, the default local transformer,
``GPTSentencePieceTokenizer``; kept at the tag ``zero-bubble-v0.1.0``):

* ``attention=eager``: the script passes no ``--use-flash-attn``, so Megatron's local attention
  materialises the s×s scores (its fused scale-mask-softmax, then dropout).  The rows' own memory
  column agrees: 1F1B at 1.5B held 30 GB per GPU, flash attention prices 12.6 GiB and the eager
  scores 27.4 GiB; 32 GB at 14.6B, 23.3 vs 32.1 GiB.
* ``vocab=32000``: the tokenizer is SentencePiece; its model file is not published, and 32,000 is
  the LLaMA SentencePiece vocabulary (a multiple of 128: Megatron pads nothing).  The paper's
  layout gives the first and the last stage one layer fewer, the head balanced as about one
  layer: at h = 2304 a 32,000 vocabulary is 1.1 layers of GEMM work, GPT-2's 50,304 would be 1.8,
  and the 1.5B rows' measured step bounds the last stage below that.  An assumption."""
CAUSAL_FLOPS = {"usp": True, "nemo-longseq": False}
"""Whether the source's TFLOP/s count causal attention work (regimes3_public.md's table)."""
FP8_RECIPE = {"fp8-lm": "fp8-delayed", "llm-foundry": "fp8-delayed", "nemo-longseq": "fp8-delayed",
              "megatron-bridge": "fp8"}
"""The plan precision of a source's ``precision: fp8`` rows, from the software it ran: Transformer
Engine's ``DelayedScaling`` (its only recipe in 2023: FP8-LM's Megatron-LM, llm-foundry's
``amp_fp8``; NeMo 24.03's default), Megatron-Bridge 26.04's per-tensor current scaling (the
rows' note); a row whose note says MXFP8 is ``mxfp8``."""


@dataclass(frozen=True)
class Unexpressible:
    """A public row the planner cannot price yet, and why."""

    ident: str
    regime: str
    source: str
    why: str


@dataclass(frozen=True)
class Pair:
    """Two rows of one ``pair_group``: the measured and predicted ratio of their step times."""

    group: str
    base: str
    other: str
    measured: float      # other / base, measured
    predicted: float     # other / base, predicted


def source_of(ident: str) -> str:
    for prefix, key in SOURCE_OF_PREFIX.items():
        if ident.startswith(prefix):
            return key
    raise ValueError(f"row {ident!r}: no source for its prefix; add it to SOURCE_OF_PREFIX")


@lru_cache(maxsize=1)
def raw_rows() -> tuple[dict, ...]:
    with open(PATH) as f:
        return tuple(json.load(f))


def cluster_name(r: dict) -> str:
    return f"{GPU_SHORTHAND[r['gpu']]}x{r['num_gpus']}"


def model_flops_per_token(spec: str, seq: int, *, causal: bool) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) of a ``gpt:``/``llama:`` spec:
    6·(matmul parameters) + 12·layers·seq·heads·head_dim (full attention: QKᵀ and AV, 2·2·s·d
    forward per token, x3 for training; Korthikanti et al.'s 72·B·s·l·h²·s/6h term), halved
    for causal."""
    family, _, args = spec.partition(":")
    kv = dict(a.split("=", 1) for a in args.split(","))
    layers, hidden, heads = int(kv["layers"]), int(kv["hidden"]), int(kv["heads"])
    head_dim = int(kv.get("head_dim", hidden // heads))
    kv_heads = int(kv.get("kv_heads", heads))
    vocab = int(kv.get("vocab", GPT_VOCAB))
    ffn = int(kv.get("ffn", 4 * hidden))
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = (3 if family == "llama" else 2) * hidden * ffn
    matmul = layers * (attn + mlp) + hidden * vocab
    scores = 12.0 * layers * seq * heads * head_dim * (0.5 if causal else 1.0)
    return 6.0 * matmul + scores


def measured_step_s(r: dict) -> float:
    """Seconds per step from what the row measured (module docstring for the order)."""
    m, gb, seq, n = r["measured"], r["global_batch"], r["seq"], r["num_gpus"]
    if (r.get("derived") or {}).get("iter_s"):
        return float(r["derived"]["iter_s"])
    if "iter_s" in m:
        return float(m["iter_s"])
    if "samples_per_s" in m:
        return gb / m["samples_per_s"]
    if "samples_per_s_per_gpu" in m:
        return gb / (m["samples_per_s_per_gpu"] * n)
    if "tokens_per_s_per_gpu" in m:
        return gb * seq / (m["tokens_per_s_per_gpu"] * n)
    causal = CAUSAL_FLOPS[source_of(r["id"])]
    return model_flops_per_token(model_spec(r), seq, causal=causal) * gb * seq / (m["tflops_per_gpu"] * 1e12 * n)


def _fields(plan: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in plan.split(","))


def precision(r: dict) -> str:
    """The plan precision of a row (``FP8_RECIPE``)."""
    if r["precision"] == "bf16":
        return "bf16"
    return "mxfp8" if "MXFP8" in (r.get("note") or "") else FP8_RECIPE[source_of(r["id"])]


def why_not(r: dict) -> str:
    """'' when the row can be priced as written; else what the planner lacks."""
    fields = _fields(r["plan"])
    try:
        if "edp" in fields:
            return _edp_why(fields)
        Plan.parse(plan_string(r), num_gpus=r["num_gpus"])
    except UserError as e:
        return f"plan refused: {e.problem}"
    return ""


def _edp_why(fields: dict[str, str]) -> str:
    """'' when the row's ``edp`` is tp·cp·dp / (etp·ep), what the folded plan derives."""
    deg = {k: int(fields.get(k, "1")) for k in ("tp", "cp", "dp", "ep", "etp", "edp")}
    if deg["tp"] * deg["cp"] * deg["dp"] == deg["etp"] * deg["ep"] * deg["edp"]:
        return ""
    return (f"edp={deg['edp']} contradicts tp·cp·dp = etp·ep·edp "
            f"({deg['tp']}·{deg['cp']}·{deg['dp']} vs {deg['etp']}·{deg['ep']}·{deg['edp']})")


def folded_etp(r: dict) -> str:
    """``etp`` of a Megatron-stack row that writes none but whose ep does not divide dp (module
    docstring): the largest divisor of tp that divides tp·cp·dp / ep; '' for any other row."""
    fields = _fields(r["plan"])
    if "etp" in fields or source_of(r["id"]) not in ("mcore-zoo", "megatron-bridge"):
        return ""
    deg = {k: int(fields.get(k, "1")) for k in ("tp", "cp", "dp", "ep")}
    if deg["dp"] % deg["ep"] == 0 or (deg["tp"] * deg["cp"] * deg["dp"]) % deg["ep"]:
        return ""
    room = deg["tp"] * deg["cp"] * deg["dp"] // deg["ep"]
    return str(max(e for e in range(1, deg["tp"] + 1) if deg["tp"] % e == 0 and room % e == 0))


GROUP_LIMITED = {"experts=256,topk=8,moe_ffn=2048,shared_experts=1,dense_layers=3": "groups=8,topk_groups=4"}
"""Group-limited routing a row's model spec does not write: DeepSeek-V3 routes each token to the
experts of its best 4 of 8 groups (its config's ``n_group``/``topk_group``; the ``deepseek-v3``
zoo model's ``groups``/``topk_groups``)."""


LATENT_ATTENTION = {"experts=256,topk=8,moe_ffn=2048,shared_experts=1,dense_layers=3":
                    "head_dim=128,kv_lora_rank=512,q_lora_rank=1536,qk_rope_dim=64,v_head_dim=128,mtp_layers=1"}
"""Multi-head latent attention and multi-token prediction a row's model spec does not write: the
DeepSeek-V3 row's note gives the MLA ("MLA attention (q_lora 1536, kv_lora 512, qk_nope 128, qk_rope
64, v_head 128)"), as the ``deepseek-v3`` zoo model builds it (``zoo.mla``; ``head_dim`` is the q/k
head without its rotary slice), and its recipe's pipeline layout ``...|tmL`` (``BRIDGE_DISPATCH``)
runs one MTP layer ``m`` on the last stage (``zoo.mtp``)."""


def model_spec(r: dict) -> str:
    """The row's model spec: a Zero Bubble row as its fork's script ran it (``ZERO_BUBBLE_MODEL``),
    ``GPT_VOCAB`` where another ``gpt:`` row publishes no vocabulary, and the group-limited routing
    of ``GROUP_LIMITED`` and the latent attention of ``LATENT_ATTENTION``."""
    spec = r["model"]
    if source_of(r["id"]) == "zero-bubble":
        spec += "".join(f",{k}={v}" for k, v in ZERO_BUBBLE_MODEL.items() if f"{k}=" not in spec)
    for extra in (GROUP_LIMITED, LATENT_ATTENTION):
        for shape, fields in extra.items():
            if shape in spec:
                spec += "," + fields
    return spec + f",vocab={GPT_VOCAB}" if spec.startswith("gpt:") and "vocab=" not in spec else spec


MEGATRON_CORE_SOURCES = ("mcore-zoo", "megatron-bridge")
"""Sources that ran Megatron-Core, whose uneven layer splits count the embedding and the loss as a
layer each (module docstring)."""


def _layer_count(spec: str) -> int:
    return int(spec.split("layers=", 1)[1].split(",", 1)[0])


def uneven_layers(r: dict) -> str:
    """``layers=`` of a Zero Bubble interleaved row, or of a Megatron-Core model-zoo row whose
    layers do not split evenly over its virtual stages (module docstring): with N = pp·vpp virtual
    stages and layers = c·N − 2, c layers per chunk and one fewer in the first and the last; ''
    for any other row."""
    fields = _fields(r["plan"])
    n, layers = int(fields.get("pp", "1")) * int(fields.get("vpp", "1")), _layer_count(r["model"])
    zoo = source_of(r["id"]) in MEGATRON_CORE_SOURCES and n > 1 and layers % n != 0 and (layers + 2) % n == 0
    if not zoo and (source_of(r["id"]) != "zero-bubble" or fields.get("schedule") != "interleaved"):
        return ""
    c, rest = divmod(layers + 2, n)
    if rest or c < 1:
        raise ValueError(f"row {r['id']}: {layers} layers is not c·pp·vpp − 2 (the interleaved layout)")
    return f"{c - 1}-{c}x{n - 2}-{c - 1}"


USP_MICRO_BATCH = 1
"""USP rows run micro-batches of one sequence, the global batch by gradient accumulation.  The JSON
writes the 30K rows (global batch 16 on 8 GPUs, dp = 1) as one micro-batch of 16, an assumption
it lists (``assumed``: "mbs=global_batch (no GA stated)").  The authors' own Megatron launch
script (github.com/feifeibear/long-context-attention, patches/Megatron-DeepSpeed.patch) sets
MICRO_BATCH_SIZE=1 and GLOBAL_BATCH_SIZE = DP · MICRO_BATCH_SIZE · MICRO_BATCH_NUM, i.e.
accumulation; and 16 sequences of 30K in one micro-batch with no recompute keep ~250 GiB of
activations per GPU, three times the 80 GB the runs had."""


def plan_string(r: dict) -> str:
    """The row's plan as the grammar reads it (USP's ``ulysses=U,ring=R`` included) less the
    ``edp`` the plan derives, with the uneven layout (``uneven_layers``), the folding a
    Megatron-stack row needs (``folded_etp``), USP rows at ``USP_MICRO_BATCH``, the precision
    (``precision``) when not bf16 and the MoE dispatch its note names (``dispatch_fields``)."""
    fields = {k: v for k, v in _fields(r["plan"]).items() if k != "edp"}
    if folded_etp(r):
        fields["etp"] = folded_etp(r)
    layers = uneven_layers(r)
    if layers:
        fields["layers"] = layers
    if source_of(r["id"]) == "usp":
        fields["mbs"] = str(USP_MICRO_BATCH)
    if precision(r) != "bf16":
        fields["precision"] = precision(r)
    fields.update(dispatch_fields(r))
    return ",".join(f"{k}={v}" for k, v in fields.items())


BRIDGE_DISPATCH = {
    "mb-2604-h100-qwen3-235b-fp8": {"ep_overlap": "on"},
    "mb-2604-h100-qwen3-30b-fp8": {"dispatcher": "deepep"},
    "mb-2604-b200-dsv3-mxfp8": {"dispatcher": "deepep", "ep_overlap": "on", "layers": "4-4x14-1"},
}
"""The MoE dispatch of Megatron-Bridge's perf recipes, which its tables do not print
(NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py
@ 01b2977e, whose V2 presets run the tables' global batches): Qwen3-235B-A22B on H100
(``QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2``: TP2 PP8 VPP4 EP32, GBS 8192) sets
``moe_a2a_overlap=True`` with the ``alltoall`` dispatcher; Qwen3-30B-A3B on H100 (``..._H100_FP8_CS_V1``:
EP16, GBS 1024) the ``flex`` dispatcher with HybridEP, hierarchical like DeepEP.  GPT-OSS-120B
(``gpt_oss_workload_base_configs.py``) keeps the recipe's default dispatcher, alltoall.
DeepSeek-V3 on B200 (``deepseek_workload_base_configs.py``, ``DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2``:
PP8 VPP2 EP32, GBS 4096) runs DeepEP with ``moe_a2a_overlap=True`` and the pipeline layout
``Et*4|(t*4|)*14tmL``: four layers a virtual stage, the embedding on the first, one layer and the
loss on the last (``layers=4-4x14-1``; its multi-token-prediction layer ``m`` runs with the loss,
``LATENT_ATTENTION``)."""


def dispatch_fields(r: dict) -> dict[str, str]:
    """The MoE dispatch a row's note names: "Dispatcher DeepEP" → ``dispatcher=deepep`` (NCCL's
    "A2A" is the default), "1f1b overlap" (Megatron-Core's combined 1F1B,
    ``--overlap-moe-expert-parallel-comm``) → ``ep_overlap=on``; for Megatron-Bridge's rows what
    the recipe sets (``BRIDGE_DISPATCH``)."""
    note = r.get("note") or ""
    out = dict(BRIDGE_DISPATCH.get(r["id"], {}))
    if "Dispatcher DeepEP" in note:
        out["dispatcher"] = "deepep"
    if "1f1b overlap" in note:
        out["ep_overlap"] = "on"
    return out


UNPUBLISHED_RECOMPUTE = ("none", "selective", "full")
"""A Megatron-stack row whose recompute its source leaves out (``unpublished``: "recompute") and
whose plan writes none is priced with the first of these under which its layout fits: what a
tuner tries in turn (no recomputation unless memory needs it), as the SC21 rows' unpublished
micro-batch and virtual stages are the model's best (``validate_published``).  Megatron-Bridge's
GPT-OSS-120B on 64 B200 (mbs 4, pp 1) holds 112 GiB of model states and, without recomputation,
three times the activations the other 52 GiB leave room for: it ran with some."""


def recompute_tried(r: dict) -> tuple[str, ...]:
    """``UNPUBLISHED_RECOMPUTE`` for a Megatron-stack row whose recompute is unpublished and
    unwritten (module docstring of ``UNPUBLISHED_RECOMPUTE``); () for any other row."""
    if source_of(r["id"]) not in ("mcore-zoo", "megatron-bridge") or "recompute" not in r.get("unpublished", ()):
        return ()
    return () if "recompute" in _fields(r["plan"]) else UNPUBLISHED_RECOMPUTE


def engine_options(r: dict) -> tuple[tuple[str, bool], ...]:
    """``EstimateOptions`` fields of the row's engine: post-validation and the WeightGradStore for
    Zero Bubble's split-backward schedules (module docstring)."""
    schedule = _fields(r["plan"]).get("schedule", "")
    if source_of(r["id"]) == "zero-bubble" and schedule in SPLIT_BACKWARD:
        return (("post_validation", True), ("wgrad_store", True))
    return ()


def rows() -> tuple[list[pr.RegimeRow], list[Unexpressible]]:
    """(the rows priced as written, the rows the planner cannot write yet)."""
    priced, refused = [], []
    for r in raw_rows():
        source, why = source_of(r["id"]), why_not(r)
        if why:
            refused.append(Unexpressible(r["id"], r["regime"], source, why))
            continue
        priced.append(pr.RegimeRow(r["regime"], r["id"], model_spec(r), cluster_name(r), r["seq"], r["global_batch"],
                                   plan_string(r), measured_step_s(r), group=r.get("pair_group") or "",
                                   source=source, options=engine_options(r), recompute_tried=recompute_tried(r)))
    return priced, refused


def pairs(priced: list[pr.Priced]) -> list[Pair]:
    """Every pair group's rows against its first row (the JSON's order: 1F1B, BF16, ...)."""
    groups: dict[str, list[pr.Priced]] = {}
    for p in priced:
        if p.row.group:
            groups.setdefault(p.row.group, []).append(p)
    out = []
    for group, members in groups.items():
        base = members[0]
        for other in members[1:]:
            out.append(Pair(group, base.row.ident, other.row.ident, other.row.published_s / base.row.published_s,
                            other.predicted_s / base.predicted_s))
    return out
