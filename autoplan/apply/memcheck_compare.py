"""The memory estimate beside torch's tracker for one plan: what ``autoplan memcheck`` prints
and the experiments tabulate (``experiments/check_search_memory.py``, ``validate_memory.py``).

``compare`` prices every pipeline rank kind of a plan and measures the chosen ones on fake
tensors (``apply.memcheck.measure``); ``reserved_row`` carries the estimate to reserved memory
with the allocator replay's gap.  GiB throughout.
"""
from __future__ import annotations

from typing import Any

from autoplan.apply.memcheck import GIB, measure, measured_pp_ranks, rank_kinds, unsupported
from autoplan.cost import EstimateOptions
from autoplan.errors import UserError
from autoplan.plan import Plan
from autoplan.workload import Workload


def compare(w: Workload, model: str, plan: Plan, *, seq: int, global_batch: int, margin_gib: float,
            pp_ranks: str | None = None, allocator: str | None = None, layout: str = "rule") -> dict:
    """The memcheck of ``plan`` on workload ``w`` (``model``: its zoo name, family spec or file):
    {plan, skipped, memory_limit_gib, rank_kinds} as ``--json`` prints it (GiB; the limit is HBM
    less ``margin_gib``); ``pp_ranks`` as ``--pp-ranks``, ``allocator`` as ``--allocator``,
    ``layout`` as ``--layout``."""
    estimator = w.estimator(EstimateOptions(memory_margin_gib=margin_gib))
    est = estimator.estimate(plan, global_batch, detail=False)
    by_rank = estimator.memory_by_rank(plan, global_batch)
    skipped = unsupported(plan, model)
    searched = estimator.layout(plan) if layout == "searched" and plan.tp > 1 and skipped is None else None
    try:
        placements = searched.placements() if searched is not None else None
    except UserError as e:
        raise UserError(e.problem, "run memcheck with --layout rule (apply's rule for a bare plan)") from None
    chosen = _pp_ranks(pp_ranks, plan.pp, max(range(plan.pp), key=lambda r: by_rank[r].total))
    kinds = []
    for pp_rank, rank in enumerate(rank_kinds(plan)):
        mem = by_rank[pp_rank]
        predicted = {**{k: v / GIB for k, v in mem.breakdown().items()}, "total": mem.total / GIB}
        row: dict[str, Any] = {
            "pp_rank": pp_rank, "rank": rank, "predicted_gib": predicted, "measured_gib": None, "error": None,
            "in_flight": {"estimate": sum(n for _, n in mem.alive), "torch": None} if plan.pp > 1 else None,
            "reserved": None}
        if skipped is None and pp_rank in chosen:
            got = measure(model, plan, seq=seq, global_batch=global_batch, rank=rank, reserved=allocator is not None,
                          # ignore[arg-type]: GPUSpec keeps HBM bytes, a whole number, as a float
                          hbm_bytes=w.cluster.gpu.hbm_bytes, placements=placements)  # type: ignore[arg-type]
            if plan.pp > 1:
                row["in_flight"]["torch"] = got.pop("in_flight")
            if allocator is not None:
                row["reserved"] = reserved_row(got.pop("reserved")[allocator], predicted["total"])
            row["measured_gib"] = {k: v / GIB for k, v in got.items()}
            row["error"] = predicted["total"] / row["measured_gib"]["total"] - 1.0
        kinds.append(row)
    return {"plan": plan.to_string(), "skipped": skipped, "rank_kinds": kinds,
            "memory_limit_gib": est.memory_limit_gib, "placements": placements}


def reserved_row(replayed: dict, estimate_gib: float) -> dict:
    """The allocator replay of one rank (``apply.memcheck.replay_reserved``, bytes) in GiB, with
    the estimate carried to reserved memory: the estimate plus the replay's gap (reserved −
    allocated peak), the cached blocks a run holds beyond what it allocates."""
    gap = (replayed["reserved_peak"] - replayed["allocated_peak"]) / GIB
    return {"allocator": replayed["allocator"], "allocated_peak_gib": replayed["allocated_peak"] / GIB,
            "reserved_peak_gib": replayed["reserved_peak"] / GIB, "gap_gib": gap, "estimate_gib": estimate_gib + gap,
            "over_capacity": replayed["over_capacity"], "needs_gib": replayed["needs"] / GIB}


def _pp_ranks(text: str | None, pp: int, highest: int) -> set[int]:
    """The pipeline ranks to measure: ``--pp-ranks`` or ``measured_pp_ranks``."""
    if text is None:
        return set(measured_pp_ranks(pp, highest))
    try:
        ranks = {int(x) for x in text.split(",")}
    except ValueError:
        ranks = {-1}
    if not ranks or min(ranks) < 0 or max(ranks) >= pp:
        raise UserError(f"--pp-ranks {text!r} is not a comma-separated list of pipeline ranks 0..{pp - 1}",
                        f"e.g. --pp-ranks 0,{pp - 1}")
    return ranks
