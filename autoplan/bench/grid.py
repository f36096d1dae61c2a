"""Brute force over the Megatron-expressible space: the best 4D plan an engineer could tune.

The grid is every combination of

    tp        ∈ divisors of the NVLink domain that divide the GPUs and the attention heads
                (and divide the KV heads or are a multiple of them) — the same topology
                constraint as the search: TP stays inside one NVLink domain
    cp        ∈ the case's ``grid_cp`` (1, or powers of two for long context), ring attention
    pp        ∈ divisors of GPUs/(tp·cp), pp ≤ layers
    dp        = GPUs/(tp·cp·pp)
    vpp       ∈ 1 (1F1B, uneven split allowed) or interleaved 1F1B with 2 ≤ vpp ≤ ``MAX_VPP``
                and layers divisible by pp·vpp (Megatron's rule for virtual stages)
    mbs       ∈ ``MBS``
    recompute ∈ none | selective | full

with the Megatron defaults held fixed: sp on (tp > 1), ZeRO-1 (the distributed optimizer),
rank order tp-cp-ep-dp-pp, ep as the megatron recipe (the largest divisor of the experts
and dp ≤ 8).  Plans that are invalid (batch not divisible, too few micro-batches for the
schedule) are skipped; every valid plan is priced by the shared ``Estimator``.  The result
is the fastest plan that fits in HBM and keeps its per-layer groups inside NVLink, and,
separately, the fastest that fits at all (MoE: megatron's ep may cross nodes).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from autoplan.baselines.common import divisors, ep_degree
from autoplan.cost import Estimate, Estimator
from autoplan.errors import UserError
from autoplan.plan import DEFAULT_ORDER, Plan
from topologies.cluster import Cluster

MEGATRON_RECOMPUTE = ("none", "selective", "full")   # what --recompute-granularity expresses

MBS = (1, 2, 4, 8)
MAX_VPP = 8
NVLINK_RULES = ("tp-inside-nvlink", "ep-inside-nvlink", "cp-inside-nvlink")


def respects_nvlink(estimate: Estimate) -> bool:
    """True when no per-layer group (TP/SP, EP, Ulysses) of the plan leaves its NVLink domain."""
    return not any(v.rule in NVLINK_RULES for v in estimate.violations)


@dataclass(frozen=True)
class GridResult:
    best: Plan | None               # fastest plan that fits and respects the NVLink rule
    best_any: Plan | None           # fastest plan that fits, rule or not
    plans: int                      # combinations generated
    valid: int                      # passed the plan checks and were priced
    fitting: int                    # fit in HBM
    seconds: float

    def to_dict(self) -> dict:
        return {"best": self.best.to_string() if self.best else None,
                "best_any": self.best_any.to_string() if self.best_any else None,
                "plans": self.plans, "valid": self.valid, "fitting": self.fitting,
                "seconds": self.seconds}


def tp_degrees(heads: int, kv_heads: int, cluster: Cluster) -> list[int]:
    """Every TP degree inside one NVLink domain that the heads and the GPU count allow."""
    kv = kv_heads or heads
    return [d for d in divisors(cluster.nvlink_domain)
            if cluster.num_gpus % d == 0 and (not heads or heads % d == 0) and (not kv or d % kv == 0 or kv % d == 0)]


def grid_plans(estimator: Estimator, global_batch: int, cp_values: tuple[int, ...]) -> Iterator[Plan]:
    """The grid's plans, in a fixed order (tp, cp, pp, vpp, mbs, recompute ascending)."""
    info, cluster = estimator.info, estimator.cluster
    layers, seq, n = estimator.model.num_layers, estimator.model.seq_len, cluster.num_gpus
    for tp in tp_degrees(info.heads, info.kv_heads, cluster):
        for cp in cp_values:
            if n % (tp * cp) or seq % cp:
                continue
            for pp in divisors(n // (tp * cp)):
                if pp > layers:
                    break
                dp = n // (tp * cp * pp)
                vpps = [1] + ([v for v in range(2, MAX_VPP + 1) if layers % (pp * v) == 0] if pp > 1 else [])
                for vpp in vpps:
                    for mbs in MBS:
                        if global_batch % (dp * mbs):
                            continue
                        for recompute in MEGATRON_RECOMPUTE:
                            yield Plan(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep_degree(info, dp, cap=8), vpp=vpp, mbs=mbs,
                                       schedule="interleaved" if vpp > 1 else "1f1b", recompute=(recompute,),
                                       sp=tp > 1, zero=1 if dp > 1 else 0, cp_algo="ring", order=DEFAULT_ORDER)


def search_grid(estimator: Estimator, global_batch: int, cp_values: tuple[int, ...] = (1,)) -> GridResult:
    """Price every grid plan; the fastest that fits (and respects NVLink), ties broken by the plan string."""
    start = time.perf_counter()
    plans = valid = fitting = 0
    best: tuple[float, str, Plan] | None = None
    best_any: tuple[float, str, Plan] | None = None
    for plan in grid_plans(estimator, global_batch, cp_values):
        plans += 1
        try:
            estimator.check(plan, global_batch)
            e = estimator.estimate(plan, global_batch, detail=False)
        except UserError:
            continue
        valid += 1
        if not e.fits:
            continue
        fitting += 1
        key = (e.step_time_s, plan.to_string(), plan)
        if best_any is None or key[:2] < best_any[:2]:
            best_any = key
        if respects_nvlink(e) and (best is None or key[:2] < best[:2]):
            best = key
    return GridResult(best[2] if best else None, best_any[2] if best_any else None, plans, valid, fitting,
                      time.perf_counter() - start)
