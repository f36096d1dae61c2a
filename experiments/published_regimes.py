"""Public rows outside the Megatron TP+PP tables, grouped by regime, and their pricing.

Read by ``experiments/validate_published.py --regimes``.  Two sources in ``../shared/reference``:

* ``regime_runs.json`` (torchtitan FSDP on A100 and H100; published layouts that must fit):
  each row carries its model spec, cluster, sequence, global batch and plan string; it is
  priced exactly as written (gradient reduction overlapped, as FSDP does).  The torchtitan
  A100 rows' network is not in that file: ``TORCHTITAN_A100_NETWORK`` is the AWS instance they
  ran on (cited there).
* ``vtrain/ground_truth_single.csv``: 1,440 Megatron-DeepSpeed GPT runs on one 8x A100-SXM4
  node (fp16, iteration ms).  Mapping, the same for every row: GPT-2 vocabulary padded to
  50,304; unfused attention (2023 Megatron-DeepSpeed: fused softmax, no flash attention);
  no activation recompute, no SP, no ZeRO, 1F1B, gradient all-reduce after backward (not
  overlapped: DeepSpeed's pipeline engine reduces at the end of the step) of the fp16 gradients
  (DeepSpeed's fp16 engine reduces them in fp16 unless ``fp32_allreduce``), priced with the
  profile of that software stack (``costmodels/profiles/a100-megatron-deepspeed.yaml``: the A100
  efficiencies plus its fitted per-op host floor, DeepSpeed's PipelineEngine host time per
  send/receive instruction and Megatron's fused softmax with its fp32 fallback).  The cluster is
  ``vtrain/cluster_a100.yaml`` with ``num_gpus`` set to the run's; runs of 2 or 4 GPUs use
  a node of that many GPUs (their NVLink ring has 2 or 4 members).

Error = predicted / published - 1.  Group (vTrain): same model, GPUs, global batch, sequence;
a group is "ranked right" when the plan the model prices fastest measures within 5 % of the
group's measured best.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

import topologies
from autoplan.cost import Estimate, EstimateOptions, Estimator
from autoplan.errors import UserError
from autoplan.frontend import trace
from autoplan.plan import Plan
from costmodels.compute import PROFILE_DIR
from topologies.cluster_yaml import from_mapping

REFERENCE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                          "shared", "reference"))
REFERENCE = os.environ.get("AUTOPLAN_REFERENCE", REFERENCE if os.path.isdir(REFERENCE) else "/work/shared/reference")
VTRAIN_VOCAB = 50304
VTRAIN_PROFILE = os.path.join(PROFILE_DIR, "a100-megatron-deepspeed.yaml")
VTRAIN_OPTIONS = EstimateOptions(overlap_grad_reduce=False, profile=VTRAIN_PROFILE, grad_reduce_bytes=2.0)
RANK_TOLERANCE = 0.05
VTRAIN_LINKS = {"nvlink_efficiency": 0.72, "nvlink_latency": 1.5e-6, "launch_latency": 48.0e-6}
"""The vTrain node's NVLink as its own nccl-tests LUTs measure it (experiments/fit_nccl_lut.py)."""
TORCHTITAN_A100 = "torchtitan-a100x64"
TORCHTITAN_A100_NETWORK: dict[str, Any] = {"nics_per_node": 2}      # Cluster fields
"""The torchtitan A100 rows' network: AWS p4d/p4de, 8x A100 80GB with 4x 100 Gb/s EFA = 400 Gb/s
per node (AWS's instance table; e.g. skypilot-org/skypilot PR 5318 lists p4de.24xlarge as A100:8
with 4 EFA), i.e. the bandwidth of 2x HDR 200G.  That the torchtitan A100 numbers came from an
AWS cluster with 400 Gb/s EFA is stated in pytorch/torchtitan issue 394 (comment of 2024-11-22;
a user's reading, not a maintainer's).  Not fitted: experiments/fit_a100_network.py, which
prices the 8 rows at 1, 2, 4 and 8 NICs, picks the same 2; a DGX A100's 8 NICs price the two
comm-heavy rows 11-19 % fast."""


@dataclass(frozen=True)
class RegimeRow:
    """One public run: what to price and what was measured."""

    regime: str          # fsdp | single-node | memory-must-fit
    ident: str
    model: str           # zoo name or family spec
    cluster: str         # shorthand, name or YAML path
    seq: int
    global_batch: int
    plan: str
    published_s: float
    group: str = ""      # vTrain ranking group
    source: str = ""     # the publication or data set (SOURCES key): the unit left out by ``--cv``
    options: tuple[tuple[str, Any], ...] = ()   # EstimateOptions fields of the run's engine (``row_options``)
    recompute_tried: tuple[str, ...] = ()       # unpublished recompute: these in turn, the first that fits


@dataclass(frozen=True)
class Priced:
    row: RegimeRow
    predicted_s: float
    memory_gib: float
    fits: bool

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.published_s - 1.0


def engine_plan(plan: str, note: str, model: str) -> str:
    """The row's plan in autoplan's recompute vocabulary, read from what its note says the run
    did (the JSON's ``recompute=selective`` is torchtitan's word for two different policies):

    * "selective op" / "selective (op)": torchtitan's selective op checkpointing -> ``op``;
    * "selective layer": torchtitan's layer SAC, every 2nd layer fully checkpointed -> ``full:N``
      with N = layers / 2 (pp = 1 in every such row: one stage holds every layer)."""
    if "recompute=selective" not in plan:
        return plan
    if "selective op" in note or "selective (op)" in note:
        return plan.replace("recompute=selective", "recompute=op")
    if "selective layer" in note and "pp=1" in plan:
        layers = int(model.split("layers=", 1)[1].split(",", 1)[0])
        return plan.replace("recompute=selective", f"recompute=full:{layers // 2}")
    return plan


# Per row id: (plan fields replaced, EstimateOptions fields) from the run's own published config,
# where the JSON's plan string does not say it.  ngc-nemotron4-340b-128: NVIDIA's
# dgxc-benchmarking nemotron4-340b config runs NeMo's distributed_fused_adam with bf16 parameters,
# gradients and Adam state (``state_precision=apex-dfa-bf16``: 4 + 6/d bytes per parameter) and
# ``activations_checkpoint_granularity: selective`` (Megatron's attention-core recompute); NeMo
# 24.09 trains on Megatron-Core (``kernels=megatron-core``; its squared-ReLU MLP has no SwiGLU, so
# the saved bytes are the trace's).
#
# llama3-405b-8k-8192: the Llama 3 paper, §3.3.2 "Pipeline parallelism improvements": "we reduce one
# Transformer layer each from the first and the last stages, respectively. This means that the first
# model chunk on the first stage has only the embedding, and the last model chunk on the last stage
# has only output projection and loss calculation" -- removing one layer empties a chunk, so every
# model chunk held one layer: 16 ranks x 8 chunks = 128 layer slots, the first holding only the
# embedding and the last only the head and loss, 126 layers in between (``vpp=8``,
# ``layers=0-1x126-0``).  N (micro-batches per round) is not published: Megatron's N = pp (DFS).
# Its kernels (Meta's own framework) are not published either: priced as the trace's eager ops.
RUN_SETTINGS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {       # (plan, EstimateOptions) fields
    "ngc-nemotron4-340b-128": ({"recompute": "selective"},
                               {"state_precision": "apex-dfa-bf16", "kernels": "megatron-core"}),
    "llama3-405b-8k-8192": ({"vpp": "8", "layers": "0-1x126-0"}, {}),
}


def with_fields(plan: str, fields: dict[str, str]) -> str:
    """``plan`` with the ``key=value`` fields of ``fields`` replaced (or added)."""
    items = dict(kv.split("=", 1) for kv in plan.split(","))
    items.update(fields)
    return ",".join(f"{k}={v}" for k, v in items.items())


# Per row-id prefix, the same for a source's every row.  usp-: the USP paper's runs are Megatron-LM
# (commit 2196398, Apr 2024, in the nemo:24.03 container: Megatron-Core's GPT model with Transformer
# Engine; regimes3_public.json's note), so Megatron-Core's kernels (``kernels=megatron-core``: the
# fused SwiGLU keeps only its input), and that Megatron-LM's defaults where the paper names no flag:
# ``--overlap-grad-reduce`` is off (``megatron/training/arguments.py`` at 2196398: ``default=False``),
# so the ZeRO-1 gradient reduce-scatter and parameter all-gather over the 16-GPU cp group run after
# the backward (``overlap_grad_reduce=False``).
#
# nemo-: NeMo 24.03 trains on Megatron-Core with Transformer Engine (its long-sequence Llama 2 rows):
# Megatron-Core's kernels, and FlashAttention-2 for the attention (``attention_kernel=fa2``,
# costmodels.attention): every row runs context parallelism, and Transformer Engine's first
# context-parallel attention (``AttnFuncWithCP``, TE 1.2-1.x, the 24.03 container's) calls
# flash-attn 2's varlen forward and backward on each ring step; cuDNN's fused attention took over
# on Hopper only with the later backend selection (``get_attention_backend``).  An inference from
# the software's history, checked against the rows: FA2's published H100 throughput prices the
# six rows -0.4 ... +5.5 %, cuDNN's -18 ... -36 %.  mb-2604-h100-llama: Megatron-Bridge 26.04's
# Llama 3 performance recipes
# (scripts/performance/configs/llama/llama3_llm_pretrain.py and utils/precision.py): Megatron-Core
# kernels, ``grad_reduce_in_fp32 = False`` (``set_llama3_common_configs``: a bf16 main-gradient buffer,
# reduced in bf16, ``state_precision=megatron-bf16-grads``, ``grad_reduce_bytes=2``) and the FP8
# current-scaling recipe ``bf16_with_fp8_current_scaling_mixed`` with ``fp8_param_gather = True``
# (FP8 parameters, ``fp8_params``); and the base recipes' ``CommOverlapConfig(tp_comm_overlap=True)``
# (``llama3_70b_pretrain_config``, ``llama31_405b_pretrain_config``: userbuffers overlap of the
# sequence-parallel collectives, ``tp_comm_overlap``); its Transformer Engine 2.x picks cuDNN's fused
# attention on Hopper (``get_attention_backend``: "FusedAttention preference on Hopper+",
# ``attention_kernel=cudnn``).
#
# mcore- and the other mb- rows: the Megatron-Core MoE model zoo and Megatron-Bridge run Megatron-Core
# (its MoE layer keeps what ``cost.ep.engine_saved_bytes`` says).
#
# llmfoundry-: the benchmark tables' runs (llm-foundry scripts/train/benchmarking/submit_benchmarks.py
# at b2a43a1, PR 543, Oct 2023: llm-foundry v0.3.0 on Composer 0.16, and for FP8 Transformer Engine
# v0.10 with ``fc_type = te``).  Its MPT (llmfoundry/models/mpt/modeling_mpt.py,
# ``loss_fn_config = om_model_config.get('loss_fn', 'fused_crossentropy')``; the mpt-1b/3b pretrain
# yamls set no loss_fn) computes the loss with flash-attn's ``CrossEntropyLoss(ignore_index=-100)`` on
# the bf16 ``outputs.logits.view(-1, V)`` (setup.py's gpu extra: flash-attn 1.0.9 and its
# csrc/xentropy ``xentropy_cuda_lib``; ``inplace_backward`` left off): the fused loss kernel
# (``loss_kernel=fused``, cost.loss), which keeps the bf16 logits and writes their bf16 gradient.
# Composer's ``amp_fp8`` opens ``te.fp8_autocast`` around the forward only (composer/core/precision.py
# at v0.16.4), and llm-foundry's train.py forces the reentrant torch ``checkpoint_wrapper`` for TE
# layers ("te.Linear layers do not support activation_checkpointing with
# activation_checkpointing_reentrant = False"): the full-recompute row reruns its layers outside the
# FP8 context, so its recompute and backward run in bf16 (``fp8_recompute=bf16``; Composer wrapped TE
# layers in TE's own checkpoint only from PR #3156, Apr 2024).  The first matching prefix wins.
RUN_SETTINGS_BY_PREFIX: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "usp-": ({}, {"kernels": "megatron-core", "overlap_grad_reduce": False}),
    "nemo-": ({}, {"kernels": "megatron-core", "attention_kernel": "fa2"}),
    "mb-2604-h100-llama": ({}, {"kernels": "megatron-core", "state_precision": "megatron-bf16-grads",
                                "grad_reduce_bytes": 2.0, "fp8_params": True, "tp_comm_overlap": True,
                                "attention_kernel": "cudnn"}),
    "mcore-": ({}, {"kernels": "megatron-core"}),
    "mb-": ({}, {"kernels": "megatron-core"}),
    "llmfoundry-": ({}, {"loss_kernel": "fused", "fp8_recompute": "bf16"}),
}


def run_settings(ident: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The row's (plan fields, EstimateOptions fields) from ``RUN_SETTINGS`` (else its prefix's in
    ``RUN_SETTINGS_BY_PREFIX``); empty when none."""
    if ident in RUN_SETTINGS:
        return RUN_SETTINGS[ident]
    return next((v for k, v in RUN_SETTINGS_BY_PREFIX.items() if ident.startswith(k)), ({}, {}))


def run_options(ident: str, base: EstimateOptions) -> EstimateOptions:
    """``base`` with the row's published engine settings (``RUN_SETTINGS``)."""
    return dataclasses.replace(base, **run_settings(ident)[1])


def row_options(row: RegimeRow, base: EstimateOptions) -> EstimateOptions:
    """``base`` with the row's engine settings: ``RUN_SETTINGS`` and the row's own ``options``."""
    return dataclasses.replace(run_options(row.ident, base), **dict(row.options))


SOURCES: dict[str, str] = {
    "sc21": "Narayanan et al., SC21, Table 1 (Megatron-LM, A100)",
    "korthikanti": "Korthikanti et al., Reducing Activation Recomputation, Table 5 and §6 (A100)",
    "torchtitan-a100": "torchtitan docs/performance.md, Apr 2024 (64 A100 80GB, FSDP2)",
    "torchtitan-h100": "torchtitan benchmarks llama3_h100_202412 (Grand Teton H100, FSDP2)",
    "llama3-paper": "Llama 3 paper, Table 4 (8,192 H100)",
    "ngc-nemotron": "NVIDIA NGC DGXC benchmark 24.11, Nemotron-4 340B (128 H100)",
    "vtrain": "vTrain ground_truth_single.csv and its NCCL LUTs (Megatron-DeepSpeed, 8x A100)",
    "zero-bubble": "Qi et al., Zero Bubble Pipeline Parallelism, Tables 3-4 (8-16 A100)",
    "usp": "Fang and Zhao, USP, arXiv 2405.07719, Tables 5-6 (8-16 A800)",
    "nemo-longseq": "NVIDIA NeMo Long Sequence Performance (H100, FP8)",
    "mcore-zoo": "Megatron-Core MoE model zoo (Qwen3-235B-A22B, 256 H100)",
    "megatron-bridge": "Megatron-Bridge 26.04 performance tables (H100, B200)",
    "fp8-lm": "Peng et al., FP8-LM, arXiv 2310.18313, Table 5 (H100)",
    "llm-foundry": "llm-foundry benchmark tables (MPT on 8 H100)",
}
"""Every public source, by the key ``validate_published.py --cv`` leaves out one at a time."""

_SOURCE_PREFIXES = (("torchtitan docs/performance.md", "torchtitan-a100"), ("torchtitan benchmarks", "torchtitan-h100"),
                    ("Llama 3 paper", "llama3-paper"), ("NVIDIA NGC", "ngc-nemotron"))


def source_of(src: str) -> str:
    """The SOURCES key of a regime_runs.json row's ``src``."""
    for prefix, key in _SOURCE_PREFIXES:
        if src.startswith(prefix):
            return key
    raise ValueError(f"unknown source {src!r}: add it to SOURCES and _SOURCE_PREFIXES")


def regime_json_rows(path: str | None = None) -> list[RegimeRow]:
    """The rows of ``regime_runs.json`` (regime = the note's ``group=``)."""
    path = path or os.path.join(REFERENCE, "regime_runs.json")
    with open(path) as f:
        raw = json.load(f)
    out = []
    for r in raw:
        parts = [part.strip() for part in r["note"].split(";")]
        note = dict(part.split("=", 1) for part in parts if "=" in part.split(" ")[0])
        cluster = r["cluster"]
        if cluster.endswith(".yaml"):
            cluster = os.path.join(os.path.dirname(path), cluster)
        elif cluster == "a100x64" and r["src"].lower().startswith("torchtitan"):
            cluster = TORCHTITAN_A100
        plan = with_fields(engine_plan(r["plan"], r["note"], r["model"]), run_settings(note["id"])[0])
        out.append(RegimeRow(note["group"], note["id"], r["model"], cluster, r["seq"], r["global_batch"], plan,
                             r["iter_s"], source=source_of(r["src"])))
    return out


def vtrain_rows(path: str | None = None) -> list[RegimeRow]:
    """The 1,440 single-node vTrain rows (see the module docstring for the mapping)."""
    path = path or os.path.join(REFERENCE, "vtrain", "ground_truth_single.csv")
    out: list[RegimeRow] = []
    with open(path, encoding="utf-8-sig") as f:
        for rec in csv.reader(f):
            if not rec or rec[0].startswith("#"):
                continue
            n, gb, mbs, h, a, l, s, tp, dp, pp, ms = (float(x) for x in rec)
            n, gb, mbs, h, a, l, s, tp, dp, pp = (int(x) for x in (n, gb, mbs, h, a, l, s, tp, dp, pp))
            model = f"gpt:layers={l},hidden={h},heads={a},vocab={VTRAIN_VOCAB},max_seq={s},attention=eager"
            plan = f"tp={tp},pp={pp},dp={dp},mbs={mbs},recompute=none,sp=off,zero=0,schedule=1f1b"
            out.append(RegimeRow("single-node", f"vtrain-{len(out)}", model, f"vtrain:{n}", s, gb, plan,
                                 ms / 1000.0, group=f"h{h} l{l} n{n} B{gb} s{s}", source="vtrain"))
    return out


H100_TDP_W = 700.0
GRAND_TETON_W = 500.0
GRAND_TETON_GPU = {
    "gpu_hbm_bytes": 96.0e9,      # HBM2e, as the torchtitan benchmark states
    "gpu_hbm_bw": 2.4e12,
    # power-limited dense BF16 peak at 500 W: H100 SXM runs dense GEMMs at its 700 W limit with the
    # voltage near its floor, where power ~ f (not f·V² with V ~ f): the sustained clock, and so
    # the peak, scale with the cap, 989 TFLOP/s · 500/700 = 706 TFLOP/s (a law, not fitted)
    "gpu_bf16_flops": 989.0e12 * GRAND_TETON_W / H100_TDP_W,
}
"""What the Grand Teton cluster YAMLs of the reference folder say in comments but do not set."""


A800_NVLINK_BW = 200.0e9
"""A800 SXM: NVLink 400 GB/s bidirectional (8 of A100's 12 links), 200 GB/s per direction."""


@lru_cache(maxsize=None)
def cluster(name: str, nics_per_node: int | None = None):
    """A row's cluster: Grand Teton YAMLs with their GPU facts, the torchtitan A100 network
    (``nics_per_node`` replaces its cited NIC count), ``vtrain:N``, ``a800xN`` (the A100 system
    with A800's NVLink) or any ``topologies.load`` name."""
    if name.startswith("a800x"):
        return from_mapping({"gpu": "a100", "num_gpus": int(name[5:]), "gpu_nvlink_bw": A800_NVLINK_BW},
                            default_name=name, source=f"{name} (A100 80GB system, A800 NVLink cap)")
    if name.endswith(".yaml") and os.path.basename(name).startswith("grandteton"):
        with open(name) as f:
            raw = yaml.safe_load(f)
        raw.update(GRAND_TETON_GPU)
        return from_mapping(raw, default_name=os.path.basename(name)[:-5], source=name)
    if name == TORCHTITAN_A100:
        network = TORCHTITAN_A100_NETWORK | ({"nics_per_node": nics_per_node} if nics_per_node else {})
        return dataclasses.replace(topologies.load("a100x64"), **network)
    if not name.startswith("vtrain:"):
        return topologies.load(name)
    n = int(name.split(":")[1])
    with open(os.path.join(REFERENCE, "vtrain", "cluster_a100.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["num_gpus"] = n
    raw.update(VTRAIN_LINKS)
    if n < raw["gpus_per_node"]:
        raw["gpus_per_node"] = raw["nvlink_domain"] = n
        raw["nics_per_node"] = min(raw["nics_per_node"], n)
        raw["leaf_nodes"], raw["pod_size"] = 1, n
    return from_mapping(raw, default_name=f"vtrain-a100x{n}", source="vtrain/cluster_a100.yaml")


@lru_cache(maxsize=None)
def _model(spec: str, seq: int):
    return trace(spec, seq=seq)


_ESTIMATORS: dict = {}


def price_row(row: RegimeRow, options: EstimateOptions) -> Priced | None:
    """Price one row as written; None when the plan does not parse or price for the row."""
    out = price_or_why(row, options)
    return out if isinstance(out, Priced) else None


def price_or_why(row: RegimeRow, options: EstimateOptions, network: dict | None = None) -> Priced | str:
    """Price one row as written; the planner's refusal (its problem line) when it cannot.
    ``network``: ``{"nics_per_node": n}`` for the torchtitan A100 cluster (``cluster``)."""
    nics = (network or {}).get("nics_per_node") if row.cluster == TORCHTITAN_A100 else None
    machines = cluster(row.cluster, nics)
    key = (row.model, row.seq, row.cluster, nics, options)
    est = _ESTIMATORS.get(key)
    if est is None:
        est = _ESTIMATORS[key] = Estimator(_model(row.model, row.seq), machines, options)
    try:
        plan = Plan.parse(row.plan, num_gpus=machines.num_gpus)
        e = _fitting(est, plan, row)
    except UserError as err:
        return err.problem
    return Priced(row, e.step_time_s, e.memory_gib, e.fits)


def _fitting(est: Estimator, plan: Plan, row: RegimeRow) -> Estimate:
    """``plan`` priced as written, or under the first of ``row.recompute_tried`` with which it
    fits (a policy the plan's other settings refuse is skipped); the last one tried if none fits."""
    e = None
    for policy in row.recompute_tried:
        try:
            e = est.estimate(plan.replace(recompute=(policy,)), row.global_batch, detail=False)
        except UserError:
            continue
        if e.fits:
            return e
    return e if e is not None else est.estimate(plan, row.global_batch, detail=False)


def price_all(rows: list[RegimeRow]) -> list[Priced]:
    """Every row priced (vTrain rows with the vTrain options, the others with FSDP's overlap)."""
    out = []
    for row in rows:
        options = VTRAIN_OPTIONS if row.regime == "single-node" else row_options(row, EstimateOptions())
        p = price_row(row, options)
        if p is not None:
            out.append(p)
    return out


def _groups(priced: list[Priced]) -> dict[str, list[Priced]]:
    groups: dict[str, list[Priced]] = {}
    for p in priced:
        groups.setdefault(p.row.group, []).append(p)
    return groups


def _chosen_and_best(members: list[Priced]) -> tuple[Priced, Priced]:
    """(the plan the model prices fastest, the plan measured fastest) of one group."""
    return (min(members, key=lambda p: (p.predicted_s, p.row.ident)),
            min(members, key=lambda p: (p.row.published_s, p.row.ident)))


def group_ranking(priced: list[Priced]) -> tuple[int, int]:
    """(groups whose predicted-best plan measures within RANK_TOLERANCE of the measured best, groups)."""
    groups = _groups(priced)
    return len(groups) - len(ranking_misses(priced)), len(groups)


def ranking_misses(priced: list[Priced]) -> list[tuple[str, Priced, Priced]]:
    """(group, predicted-best, measured-best) of every group whose predicted-best plan measures
    more than RANK_TOLERANCE above the group's measured best, in group order."""
    out = []
    for group, members in sorted(_groups(priced).items()):
        chosen, best = _chosen_and_best(members)
        if chosen.row.published_s > best.row.published_s * (1.0 + RANK_TOLERANCE):
            out.append((group, chosen, best))
    return out


def knob(plan: str, key: str) -> int:
    """The integer ``key=`` field of a plan string."""
    return int(dict(kv.split("=", 1) for kv in plan.split(","))[key])


def inversions(priced: list[Priced]) -> tuple[list[tuple[Priced, Priced]], int]:
    """(pairs, comparable pairs): every (row, its twin at twice the micro-batch) of one vTrain group
    and plan (same tp, pp, dp) with the same number of micro-batches — twice the work per
    micro-batch — and the twin's measured time below the row's; and how many such twins exist.
    A cost model whose time grows with the work prices the twin at least as slow, so it ranks
    each inverted pair the wrong way round unless the smaller micro-batch runs more kernels
    (Megatron's softmax fallback at attn_batches % 4 != 0, ``autoplan.cost.softmax``)."""
    def key(p: Priced) -> tuple:
        tp, pp, dp, mbs = (knob(p.row.plan, k) for k in ("tp", "pp", "dp", "mbs"))
        return (p.row.model, p.row.cluster, tp, pp, dp, p.row.global_batch // (dp * mbs), mbs)
    index = {key(p): p for p in priced if p.row.group}
    pairs, total = [], 0
    for k, p in sorted(index.items(), key=lambda kv: kv[1].row.ident):
        twin = index.get(k[:6] + (2 * k[6],))
        if twin is None:
            continue
        total += 1
        if twin.row.published_s < p.row.published_s:
            pairs.append((p, twin))
    return pairs, total


def summary(priced: list[Priced]) -> dict:
    """Mean/max |error| and mean signed error of a list of priced rows."""
    errs = [p.error for p in priced]
    if not errs:
        return {"rows": 0}
    return {"rows": len(errs), "mean_abs": sum(abs(e) for e in errs) / len(errs),
            "max_abs": max(abs(e) for e in errs), "mean_signed": sum(errs) / len(errs)}


def rounded_summary(numbers: dict) -> dict:
    """Per-regime summaries with floats to 4 decimals (stable JSON)."""
    return {k: {kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in v.items()}
            for k, v in numbers.items()}
