"""The robust pool: the plans a banded search prices on its paired samples and its objective ranks.

    robust_pool(est, ranked, variants, global_batch, options[, hedges]) -> [MeshResult, ...]

A plan the pool lacks cannot be chosen, however the cost model errs, so the pool is built for
the ways it errs, not only for the point ranking:

1. **Variants.**  Every searched variant of a mesh (tp, cp, ep, pp, dp) — ZeRO stage, SP, CP
   algorithm, axis order — fastest by point first, at most ``POOL_VARIANTS``.
2. **A schedule hedge** per pipeline mesh (``hedge``): its best plan at the micro-batch size of
   its fastest variant among the schedules that do not split the backward into B and W
   (1F1B, interleaved with every vpp up to ``max_vpp``, GPipe), each stage with the least
   recomputation that fits.  The mesh search keeps each variant's fastest plan only, which is
   a zero-bubble one wherever zero bubbles win on the point; but the cost of the split W pass
   is a prior (``wpass`` ∈ [1.0, 1.2], no published run), so without a hedge the pool holds no
   plan of that mesh that a slow W pass leaves alone (gpt-1t / a100x3072: ZB-V 5.1 % behind
   interleaved vpp 4 under W × 1.2).  The screening pass caps interleaving at 2 virtual stages,
   so for a mesh known from the screen only the hedge is also its first look at deeper
   interleaving (mixtral-8x22b / h100x512: tp2·ep4·pp8 screened at 4.77 s, 4.54 s at vpp 4).
3. **Meshes** are the ``pool_size`` fastest by their fastest entry (variants or hedge); hedges
   are looked for among the ``HEDGE_MESHES`` × ``pool_size`` fastest searched meshes, and one
   enters only within the pool's reach: not slower by point than the ``pool_size``-th mesh's
   fastest variant, nor by more than ``HEDGE_REACH`` than the point optimum.  A hedge further
   behind is not what a robust objective should trade the point optimum for (issue 13 bounds
   the price of robustness at 3 % of p50), and the reach is checked on the hedge's step floors
   before any of its plans is simulated, so most far meshes cost no pricing at all.
4. **Budget.**  ``POOL_PLANS`` plans (each is priced once per sample), filled by position
   across meshes — every mesh's fastest entry, then every hedge, then every mesh's next
   variant… — so that the budget goes to meshes and schedules that differ before it goes to
   near-twins (ZeRO-2 beside ZeRO-3, two axis orders of one plan).

The order is total (point step time, then the plan string), so the same search gives the same
pool byte for byte.
"""
from __future__ import annotations

from collections.abc import Callable

from autoplan.cost import Estimator
from autoplan.cost.bounds import step_lower_bound
from autoplan.errors import UserError
from autoplan.plan import Plan
from autoplan.search.records import SearchOptions
from autoplan.search.space import MeshChoice, MeshKey
from autoplan.search.stages import MeshResult, best_plan, schedule_variants
from autoplan.search.stages import memoised_floor as stage_floor
from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS

POOL_VARIANTS = 6          # searched variants per mesh the robust objectives choose among
POOL_PLANS = 40            # plans in the robust pool (each priced once per sample)
HEDGE_MESHES = 2           # hedges are looked for among HEDGE_MESHES × pool_size meshes
HEDGE_REACH = 0.05         # a hedge is at most this much slower by point than the point optimum


def _key(r: MeshResult) -> tuple[float, str]:
    return (r.found_estimate.step_time_s, r.found_plan.to_string())


def hedge(est: Estimator, plan: Plan, global_batch: int, options: SearchOptions, reach: float) -> MeshResult | None:
    """The best plan of ``plan``'s mesh variant at its micro-batch size among the schedules of
    ``options.schedules`` that do not split the backward (module docstring, 2); None when the
    mesh has no pipeline, no such schedule runs, or none fits within ``reach`` seconds.
    Interleaving is searched first (where it runs, its bubble is 1F1B's divided by vpp), the
    others only where their step floor (``plan_floor``, read before anything is simulated)
    could still beat it — and neither where its floor is beyond ``reach``."""
    schedules = tuple(s for s in options.schedules if not SCHEDULE_SPECS[s].split_backward)
    if plan.pp == 1 or not schedules:
        return None
    mesh = MeshChoice(plan.tp, plan.cp, plan.ep, plan.pp, plan.dp, plan.zero, plan.sp, plan.cp_algo, plan.order,
                      plan.ulysses, plan.precision, plan.etp)
    tiers = [t for t in (tuple(s for s in schedules if s == "interleaved"),
                         tuple(s for s in schedules if s != "interleaved")) if t]
    found: MeshResult | None = None
    for tier in tiers:
        to_beat = reach if found is None else min(reach, found.found_estimate.step_time_s)
        if not _could_beat(est, mesh, plan.mbs, global_batch, tier, options.max_vpp, to_beat):
            continue
        out = best_plan(est, mesh, global_batch, mbs_choices=(plan.mbs,), schedules=tier,
                        max_vpp=options.max_vpp, threshold=to_beat, recompute=options.constraints.recompute)
        if out.plan is not None and out.found_estimate.step_time_s <= to_beat and \
                (found is None or _key(out) < _key(found)):
            found = out
    return found


def _could_beat(est: Estimator, mesh: MeshChoice, mbs: int, global_batch: int, schedules: tuple[str, ...],
                max_vpp: int, to_beat: float) -> bool:
    """Whether a plan of ``mesh`` under ``schedules`` at micro-batch size ``mbs`` may take at most
    ``to_beat`` seconds: some plan runs, the mesh's bound without bubble (``step_lower_bound``)
    allows it, and so does some plan's step floor (``stages``' memoised ``plan_floor``, which
    ``best_plan`` reads again)."""
    m = global_batch // mesh.dp // mbs
    variants = schedule_variants(mesh.pp, m, est.model.num_layers, schedules=schedules, max_vpp=max_vpp)
    base = mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",))
    if not variants or step_lower_bound(est, base, global_batch) > to_beat:
        return False
    for schedule, vpp in variants:
        try:
            if stage_floor(est, mesh.plan(mbs=mbs, schedule=schedule, vpp=vpp, recompute=("none",)),
                           global_batch).step_s <= to_beat:
                return True
        except UserError:
            continue
    return False


def robust_pool(est: Estimator, ranked: list[MeshResult], variants: dict[str, MeshResult], global_batch: int,
                options: SearchOptions, hedges: Callable[[list[Plan], float], list[MeshResult | None]] | None = None
                ) -> list[MeshResult]:
    """The pool (module docstring): ``ranked`` is the search's best plan per mesh by point,
    ``variants`` every variant's best plan by plan string.  ``hedges(plans, reach)``: ``hedge``
    of each plan, in order (the search's workers price them; default: here, one by one)."""
    by_mesh: dict[MeshKey, list[MeshResult]] = {}
    for v in sorted(variants.values(), key=_key):
        by_mesh.setdefault(v.mesh.key, []).append(v)
    reach = min(ranked[min(options.pool_size, len(ranked)) - 1].found_estimate.step_time_s,
                ranked[0].found_estimate.step_time_s * (1.0 + HEDGE_REACH))
    looked = ranked[:HEDGE_MESHES * options.pool_size]
    heads = [by_mesh[r.mesh.key][:POOL_VARIANTS] for r in looked]
    plans = [own[0].found_plan for own in heads]
    found = hedges(plans, reach) if hedges is not None else \
        [hedge(est, plan, global_batch, options, reach) for plan in plans]
    entries: dict[MeshKey, list[MeshResult]] = {}
    for r, own, h in zip(looked, heads, found):
        known = {v.found_plan.to_string() for v in own}
        if h is not None and h.found_plan.to_string() not in known:
            own = sorted([own[0], h], key=_key) + own[1:]
        entries[r.mesh.key] = own
    meshes = sorted(entries, key=lambda k: _key(entries[k][0]))[:options.pool_size]
    pool: list[MeshResult] = []
    for position in range(POOL_VARIANTS + 1):
        for k in meshes:
            if position < len(entries[k]) and len(pool) < POOL_PLANS:
                pool.append(entries[k][position])
    return pool
