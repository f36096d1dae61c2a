"""``published``: the layout a published training run used, for the models that have one.

A model is recognised by its architecture (layers, hidden width, attention heads, experts),
so a zoo name and the equivalent family spec get the same layout.  The published degrees,
schedule, ZeRO stage and recomputation are kept as written; data parallelism takes the GPUs
left (dp = GPUs / (tp·cp·pp)), so the layout carries to another cluster size.  A knob the
source does not give is marked and set as the source's framework defaults it.

===================  =====================================================================
model                layout (source)
===================  =====================================================================
GPT-3 175B           TP 8, PP 8, interleaved vpp 6, SP, ZeRO-1, DP outermost, selective
                     recompute (MegaScale, arXiv 2402.15627 §6.1: 175B on 12,288 GPUs;
                     recompute not given: Megatron-LM's selective default)
Llama 3 405B         TP 8, CP 1, PP 16 interleaved with one layer per chunk (vpp 8), the
                     first chunk only the embedding and the last only the head and loss
                     (layers 0-1x126-0), SP, FSDP with ZeRO-2, no recompute, DP outermost
                     (Llama 3 report, arXiv 2407.21783 §3.3.2: "we reduce one Transformer
                     layer each from the first and the last stages … the first model chunk
                     on the first stage has only the embedding"; Table 4, 8K stage)
DeepSeek-V3          TP 1, PP 16 DualPipe(V), EP 64, ZeRO-1, selective recompute (RMSNorm
                     and MLA up-projections) (DeepSeek-V3 report, arXiv 2412.19437 §3.2)
Nemotron-4 340B      TP 8, PP 12 interleaved, SP, ZeRO-1 (distributed optimizer), no
                     recompute (Nemotron-4 340B report, Table 2; vpp not given: 8, as
                     experiments/validate_published.py prices it)
Mixtral 8x7B         TP 1, PP 4 interleaved vpp 8, EP 8, ZeRO-1 (distributed optimizer),
                     no recompute (NeMo-Framework-Launcher conf/training/mixtral/mixtral_8x7b.yaml)
Mixtral 8x22B        TP 8, PP 2, SP, ZeRO-1 (distributed_fused_adam), no recompute
                     (NeMo-Framework-Launcher conf/training/mixtral/mixtral_8x22b.yaml)
===================  =====================================================================

Any other model: the recipe does not apply (``UserError``): no published run to copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

NAME = "published"
SUMMARY = "the layout a published run used (GPT-3/MegaScale, Llama 3 405B, DeepSeek-V3, Nemotron-4, Mixtral)"
FAMILIES = ("dense", "moe")


@dataclass(frozen=True)
class Published:
    model: str
    arch: tuple[int, int, int, int]      # layers, hidden, heads, experts (0: dense)
    layout: str                          # plan string without dp
    source: str


LAYOUTS = (
    Published("GPT-3 175B", (96, 12288, 96, 0),
              "tp=8,pp=8,cp=1,ep=1,vpp=6,mbs=1,schedule=interleaved,recompute=selective,sp=on,zero=1,"
              "order=tp-cp-ep-pp-dp", "MegaScale (arXiv 2402.15627) §6.1"),
    Published("Llama 3 405B", (126, 16384, 128, 0),
              "tp=8,pp=16,cp=1,ep=1,vpp=8,mbs=1,schedule=interleaved,recompute=none,layers=0-1x126-0,sp=on,"
              "zero=2,order=tp-cp-ep-pp-dp", "Llama 3 report (arXiv 2407.21783) §3.3.2, Table 4"),
    Published("DeepSeek-V3", (61, 7168, 128, 256),
              "tp=1,pp=16,cp=1,ep=64,vpp=2,mbs=1,schedule=dualpipev,recompute=selective,sp=off,zero=1,"
              "order=tp-cp-ep-dp-pp", "DeepSeek-V3 report (arXiv 2412.19437) §3.2"),
    Published("Nemotron-4 340B", (96, 18432, 96, 0),
              "tp=8,pp=12,cp=1,ep=1,vpp=8,mbs=1,schedule=interleaved,recompute=none,sp=on,zero=1,"
              "order=tp-cp-ep-dp-pp", "Nemotron-4 340B report, Table 2"),
    Published("Mixtral 8x7B", (32, 4096, 32, 8),
              "tp=1,pp=4,cp=1,ep=8,vpp=8,mbs=1,schedule=interleaved,recompute=none,sp=off,zero=1,"
              "order=tp-cp-ep-dp-pp", "NeMo-Framework-Launcher conf/training/mixtral/mixtral_8x7b.yaml"),
    Published("Mixtral 8x22B", (56, 6144, 48, 8),
              "tp=8,pp=2,cp=1,ep=1,vpp=1,mbs=1,schedule=1f1b,recompute=none,sp=on,zero=1,"
              "order=tp-cp-ep-dp-pp", "NeMo-Framework-Launcher conf/training/mixtral/mixtral_8x22b.yaml"),
)


def find(model: BlockGraph) -> Published | None:
    """The published run of ``model``'s architecture, or None."""
    info = model.model
    arch = (model.num_layers, info.hidden, info.heads, info.experts or 0)
    return next((p for p in LAYOUTS if p.arch == arch), None)


def recipe(model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int, estimator: Estimator) -> Plan:
    """The published layout of ``model`` with dp = the GPUs left (module docstring)."""
    pub = find(model)
    if pub is None:
        known = ", ".join(p.model for p in LAYOUTS)
        raise UserError(f"no published training layout for {model.model.name} (published: {known})",
                        "use another recipe (megatron, megascale, llama3, fsdp, deepseek), or one of those models")
    knobs = dict(kv.split("=") for kv in pub.layout.split(","))
    room = int(knobs["tp"]) * int(knobs["cp"]) * int(knobs["pp"])
    if cluster.num_gpus % room:
        raise UserError(f"the published {pub.model} layout needs a multiple of tp·cp·pp = {room} GPUs, "
                        f"{cluster.name} has {cluster.num_gpus}", f"use a cluster of k·{room} GPUs")
    plan = Plan.parse(f"{pub.layout},dp={cluster.num_gpus // room}", num_gpus=cluster.num_gpus)
    estimator.check(plan, global_batch)
    return plan


def source(model: BlockGraph) -> str | None:
    """Where ``model``'s published layout comes from (None without one)."""
    pub = find(model)
    return f"{pub.model}: {pub.source}" if pub else None
