"""Data parallelism and ZeRO 0–3: gradient reduction, parameter gathers and the optimizer step.

Gradients are reduced over the dense dp group (cp·ep·dp ranks, ``axes.DENSE_DP``) and the
expert dp group (cp·dp, ``axes.EXPERT_DP``).  Per pipeline rank holding n parameters, by ZeRO
stage (bytes: ``GRAD_REDUCE_BYTES`` per gradient, ``PARAM_GATHER_BYTES`` per parameter):

=====  =============================================================  =======================
zero   collectives per step                                           overlapped with
=====  =============================================================  =======================
0      all-reduce of the gradients, once                              the last backward
1      reduce-scatter of the gradients + all-gather of the updated    last backward /
       parameters, once (Megatron's distributed optimizer)            first forward
2      reduce-scatter per micro-batch at pp = 1 (once per step         that micro-batch's
       under PP, as ZeRO-3) + parameter all-gather once               compute
3      2 all-gathers (forward, backward) and 1 reduce-scatter per     that micro-batch's
       micro-batch (FSDP)                                             compute
=====  =============================================================  =======================

ZeRO-1 is Megatron's distributed optimizer (one reduce-scatter per step, after the last
backward); ZeRO-2 reduces every micro-batch (DeepSpeed ZeRO-2, FSDP2 SHARD_GRAD_OP).  ZeRO-3
is FSDP2 (``fsdp``): its gathers and reduce-scatters are counted per its policy (reshard after
forward or not; gradients reduced every micro-batch at pp = 1, once per step under PP).  The
exposure of ZeRO-2 and ZeRO-3 is simulated unit by unit (``fsdp.step_exposure``: the last
reduce-scatter of every backward is exposed, as the runtimes wait for it), not by the formula below.

With ``overlap_grad_reduce`` off, every collective is exposed.  The optimizer step is memory
bound: ``OPTIMIZER_BYTES_PER_PARAM`` bytes of HBM traffic per parameter of the rank's shard.
"""
from __future__ import annotations

from dataclasses import replace

from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost import fsdp
from autoplan.cost.context import PlanContext
from autoplan.cost.types import DpComm
from costmodels.precision import gather_bytes_per_param, weight_cast_bytes

# Adam: read fp32 master, m, v, grad (16 B), write master, m, v (12 B), bf16 param (2 B), rounded up
OPTIMIZER_BYTES_PER_PARAM = 32.0
GRAD_REDUCE_BYTES = fsdp.GRAD_REDUCE_BYTES    # fp32 (Megatron's default main grads, FSDP reduce_dtype fp32)
PARAM_GATHER_BYTES = fsdp.PARAM_GATHER_BYTES  # bf16
PER_MICROBATCH = ("zero3",)                    # "zero3_step": ZeRO-2/3 traffic of some passes only


def dp_comms(ctx: PlanContext, dense: float, expert: float, m: int, pol: fsdp.Policy | None = None) -> list[DpComm]:
    """Data-parallel collectives of one pipeline rank holding ``dense`` + ``expert`` parameters,
    on the dense and expert dp groups of rank 0 (ZeRO-3 counted by ``pol``, FSDP2's defaults when
    None; ``EstimateOptions.grad_reduce_bytes`` per reduced gradient)."""
    plan, prices, grad_bytes = ctx.plan, ctx.prices, ctx.options.grad_reduce_bytes
    out: list[DpComm] = []
    for numel, ranks in ((dense, ctx.mesh.group(DENSE_DP)), (expert, ctx.mesh.group(EXPERT_DP))):
        if numel == 0 or len(ranks) <= 1:
            continue
        grads = numel * grad_bytes
        # FP8 under FSDP2's float8 gather, and under Megatron's --fp8-param-gather (``fp8_params``)
        params = numel * gather_bytes_per_param(plan.precision, plan.zero, ctx.options.fp8_params)
        if plan.zero == 0:
            out.append(DpComm("all_reduce", grads, 1, prices.collective("all_reduce", grads, ranks), ranks, "grad"))
        elif plan.zero == 1:
            out.append(DpComm("reduce_scatter", grads, 1, prices.collective("reduce_scatter", grads, ranks), ranks,
                              "grad"))
            out.append(DpComm("all_gather", params, 1, prices.collective("all_gather", params, ranks), ranks, "param"))
        else:                     # ZeRO-2 is ZeRO-3 that never reshards (fsdp.policy)
            out += _zero3_comms(ctx, params, grads, ranks, m, pol)
    return out


def _zero3_comms(ctx: PlanContext, params: float, grads: float, ranks: tuple[int, ...], m: int,
                 pol: fsdp.Policy | None) -> list[DpComm]:
    """FSDP2's gathers (forward passes, and backward ones under reshard) and reduce-scatters per
    step; ZeRO-2 is the policy that never reshards.  Labelled ``zero3`` when they recur every
    micro-batch, ``zero3_step`` when only some passes carry them."""
    plan = ctx.plan
    pol = pol or fsdp.Policy(fsdp.DEFAULT_PREFETCH, plan.pp == 1 and plan.zero == 3, plan.pp == 1)
    gathers, reduces, gather_only = fsdp.passes(pol, m)
    t_ag = ctx.prices.collective("all_gather", params, ranks)
    t_rs = ctx.prices.collective("reduce_scatter", grads, ranks)
    out = [DpComm("all_gather", params, gathers, gathers * t_ag, ranks, "zero3" if pol.reshard else "zero3_step"),
           DpComm("reduce_scatter", grads, reduces, reduces * t_rs, ranks,
                  "zero3" if pol.reduce_every_microbatch else "zero3_step")]
    if pol.reshard:      # backward re-gathers (all but the units kept gathered: not counted per micro-batch)
        out.append(DpComm("all_gather", params, reduces + gather_only, (reduces + gather_only) * t_ag, ranks,
                          "zero3_step"))
    return out


def per_microbatch_seconds(colls: list[DpComm], m: int) -> float:
    return sum(c.seconds for c in colls if c.when in PER_MICROBATCH) / m


def dp_exposed(colls: list[DpComm], m: int, *, overlap: bool, last_backward: float, first_forward: float,
               zero3: fsdp.Exposure | None = None, hide: float = 1.0) -> tuple[float, list[DpComm]]:
    """Seconds the data-parallel collectives add to the step, and the collectives that charge
    them (each with its ``exposed_s``: they add up to the seconds, none beyond its own time).

    ZeRO-2/3 with overlap: ``zero3`` (``fsdp.step_exposure``, which takes the same ``hide``): its
    seconds, charged to the per-unit collectives it simulated (``colls`` only counts them).
    Otherwise (no FSDP simulation given) per micro-batch traffic hides behind that
    micro-batch's compute; once-per-step traffic behind the last backward (gradients) and the
    first forward (parameter all-gather), as Megatron overlaps them; each term is shared among
    its collectives in proportion to their time.  ``hide``: the share of those compute windows the
    traffic can hide behind (1 at the point estimate)."""
    if not colls:
        return 0.0, []
    if overlap and zero3 is not None:
        return zero3.seconds, list(zero3.colls)
    if not overlap:
        return sum(c.seconds for c in colls), [replace(c, exposed_s=c.seconds) for c in colls]
    last_backward, first_forward = last_backward * hide, first_forward * hide
    per_mb = per_microbatch_seconds(colls, m)
    once_grad = sum(c.seconds for c in colls if c.when == "grad")
    once_param = sum(c.seconds for c in colls if c.when == "param")
    terms = {"grad": (max(0.0, once_grad - last_backward), once_grad),
             "param": (max(0.0, once_param - first_forward), once_param)}
    mb = m * max(0.0, per_mb - (first_forward + last_backward))
    terms.update(dict.fromkeys(PER_MICROBATCH, (mb, sum(c.seconds for c in colls if c.when in PER_MICROBATCH))))
    charged = []
    for c in colls:
        x, of = terms.get(c.when, (0.0, 0.0))
        charged.append(replace(c, exposed_s=min(c.seconds, x * c.seconds / of) if of else 0.0))
    return mb + terms["grad"][0] + terms["param"][0], charged


def optimizer_seconds(ctx: PlanContext, numel: float, expert: float = 0.0) -> float:
    """The optimizer step on one GPU holding ``numel`` dense and ``expert`` expert parameters: its
    shard's HBM traffic (under ZeRO ≥ 1 the dense ones sharded over the dense dp group, the
    expert ones over the expert dp group: Megatron-Core's distributed optimizer shards each over
    the ranks that hold a replica of it), then, under an FP8 precision, the cast of the weights
    it holds to FP8 for the next step (``costmodels.precision``: the whole bf16 weights a
    ZeRO-0/1/2 rank holds; the shard before FSDP2 gathers it at ZeRO-3)."""
    plan, prices = ctx.plan, ctx.prices
    dp_size = len(ctx.mesh.group(DENSE_DP))
    shard = max(dp_size, 1) if plan.zero >= 1 else 1
    held = numel / max(dp_size, 1) if plan.zero == 3 else numel
    nbytes = numel / shard * OPTIMIZER_BYTES_PER_PARAM + weight_cast_bytes(plan.precision, held)
    if expert:
        edp = max(len(ctx.mesh.group(EXPERT_DP)), 1)
        nbytes += expert / (edp if plan.zero >= 1 else 1) * OPTIMIZER_BYTES_PER_PARAM + weight_cast_bytes(
            plan.precision, expert / edp if plan.zero == 3 else expert)
    return nbytes / (prices.cluster.gpu.hbm_bw * prices.profile.memory_fraction)
