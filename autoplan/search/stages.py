"""The pipeline part of the search: for one mesh, the best micro-batch size, schedule,
virtual stages, stage cuts and recomputation per stage.

For every micro-batch size and schedule variant (``schedule_variants``):

1. **Stage cuts.**  Layers are near-identical, so the even split is one candidate; the other
   is the balanced split of ``balanced_cuts``, a dynamic program over layer boundaries that
   minimises the heaviest pipeline rank's work (F + B + W per micro-batch), the first rank
   carrying the embedding and the last the head and the loss — which usually moves a layer
   or two off the last stage.
2. **Recomputation per stage.**  A rank's memory depends on its own recompute policy only
   (its states plus its saved activations times the micro-batches it holds in flight), and
   its time grows with it; so each rank takes the least recomputation that fits
   (none < selective < op < full), read off the estimates under each uniform policy.  Asked
   for (``space.PARTIAL_OP`` among the policies; not by default, since no engine but
   ``autoplan run`` checkpoints ops of some layers only), where every rank takes ``op``,
   ``op:N`` — op on the first N layers of each virtual stage only — with the least N that fits
   is priced beside it and the faster kept (``partial_op``): the memory between none and op in
   steps of one layer, so a stage that needs part of op's saving does not pay all of its
   recomputation.
3. The resulting plan is priced by ``Estimator.estimate`` — the one judge of every plan.

No repeated work (unless ``EstimateOptions.exact``, the reference path, which prices every
variant and policy): estimates are memoised per Estimator; within one micro-batch size the
variants are priced best-first by ``plan_floor`` (a lower bound on the step under any
recompute policy, without simulating), and a variant whose floor exceeds the mesh's best so
far is not priced at all — what it could still change, ``memory_limited``, is read off the
floor's exact ``fits``; a plan that does not fit without recomputation is not priced under
the other policies when ``recompute_floor`` shows none of them can beat that best.  None of
this changes the best plan: a skipped plan is strictly slower than one already found, and
the micro-batch sizes are visited in the same order as without the shortcuts, so the same
ones are skipped.

``best_plan`` returns the fastest plan that fits, or the smallest memory shortfall.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from autoplan.cost import Estimate, Estimator
from autoplan.cost.bounds import Floor, Memory, plan_floor, plan_memory, step_lower_bound
from autoplan.cost.memo import PlanAt
from autoplan.errors import UserError
from autoplan.plan import RECOMPUTE, V_SCHEDULES, Plan
from autoplan.search.space import PARTIAL_OP, MeshChoice, recomputed
from costmodels.memo import memo
from costmodels.memory import GIB
from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS


@dataclass(frozen=True)
class MeshResult:
    mesh: MeshChoice
    plan: Plan | None
    estimate: Estimate | None
    shortfall_gib: float          # smallest memory excess over HBM seen (0 when a plan fits)
    evaluated: int                # plans priced
    pruned: bool = False          # every micro-batch size was bounded out
    memory_limited: bool = False  # some candidate needed recomputation or did not fit
    # the largest lower bound among the micro-batch sizes searched (−inf: none): ``best_plan``
    # returns this same result at every threshold above it (``same_below``)
    searched_bound: float = float("-inf")

    def same_below(self, threshold: float) -> bool:
        """Whether ``best_plan`` at ``threshold``, lower than the one this ran at, returns this
        result: the threshold only skips micro-batch sizes whose bound reaches it, and each size
        searched is searched again (its bound is below) with the same best before it, so the
        same sizes are searched and skipped, in the same order."""
        return self.searched_bound < threshold

    @property
    def found_plan(self) -> Plan:
        """``plan``, for a result known to have found one (a result without one raises)."""
        if self.plan is None:
            raise ValueError(f"no plan of {self.mesh} was found")
        return self.plan

    @property
    def found_estimate(self) -> Estimate:
        """``estimate``, for a result known to have found a plan (a result without one raises)."""
        if self.estimate is None:
            raise ValueError(f"no plan of {self.mesh} was found")
        return self.estimate


# what ``_best_recompute`` returns: ((step seconds, plan) | None, shortfall GiB, plans priced)
Recomputed = tuple[tuple[float, Plan] | None, float, int]


def schedule_variants(pp: int, m: int, layers: int, *, schedules: tuple[str, ...],
                      max_vpp: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs that can run ``m`` micro-batches on ``pp`` ranks."""
    if pp == 1:
        return [("1f1b", 1)]
    out: list[tuple[str, int]] = []
    for name in schedules:
        if name == "interleaved":
            for v in range(2, max_vpp + 1):
                if pp * v <= layers and m % pp == 0:
                    out.append((name, v))
            continue
        vpp = 2 if name in V_SCHEDULES else 1
        if pp * vpp > layers:
            continue
        if name == "gpipe" and m >= pp and "1f1b" in schedules:
            continue      # same bubble as 1F1B, more micro-batches in flight: dominated
        spec = SCHEDULE_SPECS[name]
        if m < spec.min_microbatches(pp) or (name != "gpipe" and m < pp):
            continue
        out.append((name, vpp))
    return out


@memo(4096)
def balanced_cuts(layer_work: tuple[float, ...], pre: float, post: float,
                  rank_of_chunk: tuple[int, ...], slack: int | None = None) -> tuple[int, ...]:
    """Layers per virtual stage minimising the heaviest rank's work.

    ``layer_work[i]`` is layer i's F+B+W per micro-batch; chunk 0 also carries ``pre`` and
    the last chunk ``post``.  Each chunk gets within ``slack`` layers of the even share,
    so the DP over (chunk, layers so far) is O(chunks · layers · slack).  The default slack
    is what the heavier end is worth in layers, ⌈max(pre, post) / min(layer_work)⌉ + 1: a chunk
    that carries the embedding or the head sheds at most that many layers to balance it, and
    no other chunk moves further from even than the layers shed.  Measured with ``layer_work``:
    a 256K-vocabulary head on a hidden-2304 model (Gemma-2-2B's shape) is 6.7 layers, Llama 3
    8B's 2.3, Llama 3 405B's 0.6, GPT-3 175B's 0.3.

    Per layers-used count the DP keeps the least (max rank load, cuts), lexicographic; one
    numpy pass per chunk over every (state, chunk size)."""
    n, chunks = len(layer_work), len(rank_of_chunk)
    if slack is None:
        lightest = min(layer_work) if layer_work else 0.0
        slack = 1 + (math.ceil(max(pre, post) / lightest) if lightest > 0 else n)
    sums = [0.0]
    for w in layer_work:
        sums.append(sums[-1] + w)
    prefix = np.array(sums)
    even = n / chunks
    lo, hi = max(1, int(even) - slack), int(even) + 1 + slack
    ks = np.arange(lo, hi + 1)
    # states (one per layers used so far, ascending): the best (max rank load, cuts) reaching it,
    # its rank loads, and ``order``, the rank of its cuts among the states' (lexicographic)
    used, peak, order = np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64)
    loads = np.zeros((1, max(rank_of_chunk) + 1))
    back = []                          # per chunk: each state's parent state and its layers
    for c in range(chunks):
        remaining, rank = chunks - c - 1, rank_of_chunk[c]
        first, last = (pre if c == 0 else 0.0), (post if c == chunks - 1 else 0.0)
        ends = used[:, None] + ks[None, :]
        si, ki = np.nonzero(ends <= n - remaining if remaining else ends == n)
        e = ends[si, ki]
        load = loads[si, rank] + (prefix[e] - prefix[used[si]] + first + last)
        p = np.maximum(peak[si], load)
        # per end the least (peak, cuts): cuts of distinct parents differ before the new chunk,
        # so their order is the parents' order
        idx = np.lexsort((order[si], p, e))
        keep = idx[np.r_[True, e[idx][1:] != e[idx][:-1]]] if len(idx) else idx
        parent, k = si[keep], ks[ki[keep]]
        used, peak, loads = e[keep], p[keep], loads[parent]
        loads[:, rank] = load[keep]
        by_cuts = np.lexsort((k, order[parent]))
        order = np.empty_like(by_cuts)
        order[by_cuts] = np.arange(len(by_cuts))
        back.append((parent, k))
    at = np.flatnonzero(used == n)
    if not len(at):
        raise ValueError(f"no cut of {n} layers into {chunks} stages within ±{slack} of even")
    i, cuts = int(at[0]), []
    for parent, k in reversed(back):
        cuts.append(int(k[i]))
        i = int(parent[i])
    return tuple(reversed(cuts))


SCREEN_SCHEDULES = ("1f1b", "zb-h1", "zbv", "interleaved")


def best_plan(est: Estimator, mesh: MeshChoice, global_batch: int, *, mbs_choices: tuple[int, ...],
              schedules: tuple[str, ...], max_vpp: int, threshold: float = float("inf"),
              screen: bool = False, recompute: tuple[str, ...] = RECOMPUTE) -> MeshResult:
    """The fastest plan of ``mesh`` that fits, searching mbs, schedule, vpp, cuts and recompute
    (each stage the weakest policy of ``recompute``, in ``RECOMPUTE`` order, that fits).

    Micro-batch sizes whose lower bound cannot beat ``threshold`` (the search's K-th best so
    far) or this mesh's best so far are skipped, cheapest bound first.  ``screen`` narrows
    the pipeline knobs to a representative few (1F1B, ZB-H1, ZB-V, interleaved with 2
    chunks; even cuts) for the search's first pass over meshes."""
    if screen:
        schedules = tuple(x for x in schedules if x in SCREEN_SCHEDULES)
        max_vpp = min(max_vpp, 2)
    best: tuple[float, str, Plan] | None = None
    shortfall = float("inf")
    evaluated = 0
    local_batch = global_batch // mesh.dp
    bounded = sorted((step_lower_bound(est, mesh.plan(mbs=mbs, schedule="1f1b", vpp=1, recompute=("none",)),
                                            global_batch), mbs) for mbs in mbs_choices if local_batch % mbs == 0)
    skipped = 0
    limited = False
    searched = float("-inf")
    reuse = not est.options.exact
    for lb, mbs in bounded:
        if lb >= threshold or (best is not None and lb >= best[0]):
            skipped += 1
            continue
        searched = lb
        plans = _variants(est, mesh, mbs, local_batch // mbs, schedules, max_vpp, screen)
        for floor, fits, plan in (_best_first(est, plans, global_batch) if reuse else
                                  [(0.0, True, x) for x in plans]):
            to_beat = best[0] if best is not None else float("inf")
            if floor > to_beat:   # cannot win; all it could teach is whether it needs recompute
                limited = limited or not fits
                continue
            result, short, n = _best_recompute(est, plan, global_batch, to_beat if reuse else float("inf"),
                                               recompute)
            evaluated += n
            shortfall = min(shortfall, short)
            limited = limited or result is None or result[1].recompute != recompute[:1]
            if result is not None:
                key = (result[0], result[1].to_string())
                if best is None or key < best[:2]:
                    best = (key[0], key[1], result[1])
    if best is None:
        return MeshResult(mesh, None, None, shortfall, evaluated, pruned=skipped == len(bounded),
                          memory_limited=limited, searched_bound=searched)
    final = _estimate(est, best[2], global_batch)        # ``detailed`` prices the rest where it is shown
    return MeshResult(mesh, best[2], final, 0.0, evaluated + 1, memory_limited=limited, searched_bound=searched)


def detailed(est: Estimator, result: MeshResult, global_batch: int) -> MeshResult:
    """``result`` with the full estimate of its plan.  ``best_plan`` returns the search's
    ``detail=False`` one: the same step, memory and fit to the bit (the same simulation and
    sums); only the exposed share of stage-to-stage P2P (a second simulation) and the primitive
    table are left out, so they are priced for the plans a search shows, not for every mesh."""
    if result.plan is None:
        return result
    return replace(result, estimate=est.estimate(result.plan, global_batch))


def _variants(est: Estimator, mesh: MeshChoice, mbs: int, m: int, schedules: tuple[str, ...], max_vpp: int,
              screen: bool) -> list[Plan]:
    """Every (schedule, vpp, cuts) plan of one micro-batch size, without recomputation."""
    out = []
    for schedule, vpp in schedule_variants(mesh.pp, m, est.model.num_layers, schedules=schedules, max_vpp=max_vpp):
        base = mesh.plan(mbs=mbs, schedule=schedule, vpp=vpp, recompute=("none",))
        out += [base.replace(layers=cuts) for cuts in ([()] if screen else _cut_variants(est, base))]
    return out


def memoised_floor(est: Estimator, plan: Plan, global_batch: int) -> Floor:
    """``plan_floor``, memoised with the estimates (the screening pass, the refinement and the
    recompute policies ask for the same plans); a UserError is remembered and raised again."""
    floor: Floor = est.memo.floors.get(PlanAt(plan, global_batch), lambda: plan_floor(
        est, plan, global_batch, memoised_memory(est, plan, global_batch)))
    return floor


def memoised_memory(est: Estimator, plan: Plan, global_batch: int) -> Memory:
    """``plan_memory``, memoised as ``memoised_floor`` (the recompute policies a plan is not
    priced under need their memory only, not a step floor)."""
    memory: Memory = est.memo.memories.get(PlanAt(plan, global_batch), lambda: plan_memory(est, plan, global_batch))
    return memory


def _best_first(est: Estimator, plans: list[Plan], global_batch: int) -> list[tuple[float, bool, Plan]]:
    """(floor, fits, plan) by ascending ``plan_floor`` (ties: generation order); a plan the
    estimate refuses gets floor inf and does not fit (pricing it would raise)."""
    out = []
    for i, plan in enumerate(plans):
        try:
            floor = memoised_floor(est, plan, global_batch)
            out.append((floor.step_s, i, floor.fits, plan))
        except UserError:
            out.append((float("inf"), i, False, plan))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(floor, fits, plan) for floor, _, fits, plan in out]


def _cut_variants(est: Estimator, plan: Plan) -> list[tuple[int, ...]]:
    """Even split (as ``()``) and, for pipelines, the balanced uneven split."""
    if plan.pp == 1:
        return [()]
    variants: list[tuple[int, ...]] = [()]
    if plan.schedule == "interleaved":
        return variants
    work = est.layer_work(plan)
    ranks = tuple(plan.stage_rank(c) for c in range(plan.pp * plan.vpp))
    try:
        cuts = balanced_cuts(work.layers, work.pre, work.post, ranks)
    except ValueError:
        return variants
    if cuts != plan.stage_layers(est.model.num_layers):
        variants.append(cuts)
    return variants


def recompute_floor(none: Estimate) -> float:
    """A lower bound on the step time of the plan of ``none`` (its estimate without
    recomputation) under any recompute policy: its step less its exposed data-parallel time,
    less a relative 1e-9 for summation order.  Recomputation keeps every op's layout (the
    block ILP is solved without recompute and re-priced) and only lengthens backwards, the
    simulated makespan is monotone in every duration, and the embedding sync and optimizer
    step do not change; only the exposed data-parallel time can shrink (more backward to hide
    it under)."""
    return (none.step_time_s - none.time_breakdown_s["dp_exposed"]) * (1 - 1e-9)


def _best_recompute(est: Estimator, plan: Plan, global_batch: int, to_beat: float = float("inf"),
                    policies: tuple[str, ...] = RECOMPUTE) -> Recomputed:
    """Least recomputation per stage that fits, among ``policies`` (weakest first); returns
    ((step seconds, plan) | None, shortfall GiB, plans priced).

    Memory needs no simulation (``plan_floor``), so only the chosen plan is priced — and not
    even it when its floor exceeds ``to_beat`` (the mesh's best: it cannot win, and is
    reported as not fitting, as ``_best_recompute_priced`` does).  The choice, shortfall and
    estimate are ``_best_recompute_priced``'s (the reference path, ``EstimateOptions.exact``)."""
    if est.options.exact:
        return _best_recompute_priced(est, plan, global_batch, to_beat, policies)
    asked, policies = policies, uniform_policies(policies)
    mems: dict[str, Memory] = {}
    choice: list[str | None] = [None] * plan.pp
    hbm = est.usable_bytes / GIB
    for policy in policies:            # weakest first; a policy no rank still needs is not looked at
        uniform = recomputed(plan, (policy,))
        try:
            mems[policy] = memoised_memory(est, uniform, global_batch)
        except UserError:              # the plan's validity does not depend on its uniform policy
            return None, float("inf"), 0
        if policy == policies[0] and mems[policy].fits:
            return (_step_time(est, uniform, global_batch), uniform), 0.0, 1
        per_stage = mems[policy].memory_per_stage_gib
        choice = [c if c is not None or per_stage[r] > hbm else policy for r, c in enumerate(choice)]
        if None not in choice:
            break
    if None in choice:
        return None, mems[policies[-1]].memory_per_stage_gib[choice.index(None)] - hbm, 0
    picked = [c for c in choice if c is not None]      # all of them
    mixed = recomputed(plan, tuple(picked) if len(set(picked)) > 1 else (picked[0],))
    mem = mems[picked[0]] if len(set(picked)) == 1 else memoised_memory(est, mixed, global_batch)
    if not mem.fits:
        return None, mem.memory_gib - hbm, 0
    try:
        if memoised_floor(est, mixed, global_batch).step_s > to_beat:
            return None, float("inf"), 0
    except UserError:
        return None, float("inf"), 0
    return _faster_partial(est, (_step_time(est, mixed, global_batch), mixed), global_batch, asked, _step_time)


def _best_recompute_priced(est: Estimator, plan: Plan, global_batch: int,
                           to_beat: float = float("inf"), policies: tuple[str, ...] = RECOMPUTE) -> Recomputed:
    """``_best_recompute`` by pricing every uniform policy (the reference path).

    ``to_beat``: the mesh's best step so far.  When the plan does not fit without
    recomputation and ``recompute_floor`` of that estimate exceeds it, no policy can win:
    the others are not priced and it is reported as not fitting (shortfall inf; the caller
    has a fitting plan, so no shortfall is read)."""
    per_policy: dict[str, Estimate] = {}
    priced = 0
    asked, policies = policies, uniform_policies(policies)
    for policy in policies:
        try:
            e = _estimate(est, recomputed(plan, (policy,)), global_batch)
        except UserError:
            return None, float("inf"), priced
        priced += 1
        per_policy[policy] = e
        if e.fits and policy == policies[0]:
            return (e.step_time_s, recomputed(plan, (policy,))), 0.0, priced
        if policy == "none" and recompute_floor(e) > to_beat:
            return None, float("inf"), priced
    hbm = est.usable_bytes / GIB
    choice = []
    for rank in range(plan.pp):
        fitting = [p for p in policies if per_policy[p].memory_per_stage_gib[rank] <= hbm]
        if not fitting:
            return None, per_policy[policies[-1]].memory_per_stage_gib[rank] - hbm, priced
        choice.append(fitting[0])
    mixed = recomputed(plan, tuple(choice) if len(set(choice)) > 1 else (choice[0],))
    final = per_policy.get(choice[0]) if len(set(choice)) == 1 else None
    if final is None:
        final = _estimate(est, mixed, global_batch)
        priced += 1
    if not final.fits:
        return None, final.memory_gib - hbm, priced
    found, step, more = _faster_partial(est, (final.step_time_s, mixed), global_batch, asked,
                                        lambda e, p, b: _estimate(e, p, b).step_time_s)
    return found, step, priced + more - 1


def partial_op(est: Estimator, plan: Plan, global_batch: int, policies: tuple[str, ...]) -> Plan | None:
    """``plan`` (every stage ``op``) with ``op:N``, the least N that fits (memory falls as N
    grows: fewer layers keep everything), found by bisection on ``memoised_memory`` (no
    simulation); None where ``PARTIAL_OP`` is not among ``policies``, a stage is not ``op``,
    or no N below a stage's layers fits."""
    if set(plan.recompute) != {"op"} or PARTIAL_OP not in policies:
        return None
    hi = max(plan.stage_layers(est.model.num_layers)) - 1      # op on all of the largest stage: op
    if hi < 1 or not memoised_memory(est, recomputed(plan, (f"op:{hi}",)), global_batch).fits:
        return None
    lo = 0                                                      # lo does not fit (op:0 = none), hi does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memoised_memory(est, recomputed(plan, (f"op:{mid}",)), global_batch).fits:
            hi = mid
        else:
            lo = mid
    return recomputed(plan, (f"op:{hi}",))


def uniform_policies(policies: tuple[str, ...]) -> tuple[str, ...]:
    """The policies a stage takes as a whole (``policies`` less ``PARTIAL_OP``)."""
    return tuple(p for p in policies if p != PARTIAL_OP)


def _faster_partial(est: Estimator, found: tuple[float, Plan], global_batch: int, policies: tuple[str, ...],
                    step_of: Callable[[Estimator, Plan, int], float]) -> Recomputed:
    """``found`` (step seconds, plan) or its ``partial_op``, whichever is faster (ties to
    ``found``), with the plans priced (1, or 2 where there is a partial plan)."""
    partial = partial_op(est, found[1], global_batch, policies)
    if partial is None:
        return found, 0.0, 1
    step = step_of(est, partial, global_batch)
    return ((step, partial) if step < found[0] else found), 0.0, 2


def _estimate(est: Estimator, plan: Plan, global_batch: int) -> Estimate:
    """``est.estimate(plan, global_batch, detail=False)``, memoised per Estimator on the plan
    (the screening pass, the refinement and the ZeRO variants of one mesh ask for the same
    plans; a UserError is remembered and raised again)."""
    if est.options.exact:
        return est.estimate(plan, global_batch, detail=False)
    e: Estimate = est.memo.estimates.get(PlanAt(plan, global_batch),
                                         lambda: est.estimate(plan, global_batch, detail=False))
    return e


def _step_time(est: Estimator, plan: Plan, global_batch: int) -> float:
    """``_estimate(...).step_time_s`` without what the step does not read (``Estimator
    .step_time_s``, equal to the bit), memoised: what the stage search compares plans by."""
    step: float = est.memo.steps.get(PlanAt(plan, global_batch), lambda: est.step_time_s(plan, global_batch))
    return step
