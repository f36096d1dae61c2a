"""Run one benchmark case: trace, search, recipes, grid — every contender priced by one Estimator.

    run_case(case, workers=0, search_timeout_s=900) -> dict

Contenders, in this order:

* ``auto``: the best plan of ``autoplan.search.search`` (its default options: top 5, every
  schedule, ZeRO 0–3, the NVLink rule enforced), re-priced by the harness's Estimator;
* ``grid``: the best plan of the Megatron grid (``bench.grid``);
* one per recipe of ``autoplan.baselines.RECIPES`` (megatron, megascale, llama3, fsdp,
  deepseek), each tuned within its family (``baselines.tuning``: micro-batch, virtual stages,
  recomputation — what a careful engineer runs; ``recipe_plan`` is the recipe's own plan); a
  recipe that cannot apply (deepseek on a dense model, fsdp when the batch does not split over
  the GPUs, nothing on its ladder fits) is a row with status ``n/a`` and why;
* ``published``: the layout a published run used, as published (not tuned: it ran as written).

Every plan is priced by the same ``Estimator`` (``Estimator.estimate``: plan checks, then the
estimate), which prices hand plans as written and flags rule breaks, so a
recipe whose EP group crosses nodes is priced on the slower links and marked
``respects_nvlink = False``.

Ratios (throughput, tokens/s; above 1 the automatic plan is faster):

    auto_vs_hand     = auto / the fastest credible recipe that fits and respects the NVLink rule
    auto_vs_hand_any = auto / the fastest credible recipe that fits
    auto_vs_grid     = auto / grid

A published layout *ran*, so it is a hand baseline whatever the memory model says: where the
model prices it above HBM it still counts (at its priced step time), and its row says
``memory_model_miss`` — the memory model's error, not a plan that cannot run.

A recipe is *credible* on a model when it was written for the model's family
(``baselines.credible``: the llama3 recipe is no hand plan for an MoE model; ``published`` only
where the model has a published layout).  The bands: auto and the best credible hand plan
(``band_hand``; where none respects the NVLink rule, the fastest credible one regardless) priced
on the same paired parameter samples (``cost.uncertainty.Sampler``), the ratio
hand step / auto step per sample, its p10/p50/p90 (``auto_vs_hand_p10`` ...) and the share
of samples where auto is faster (``p_auto_beats_hand``).  Beside them: the regimes the auto plan
leans on without a timed published run (``auto_evidence``, ``cost.evidence``), the GPU
profile's residuals on the public rows (``profile_residuals``) and the out-of-sample mean error
of the validated regimes it is priced like (``auto_out_of_sample``, ``cost.evidence.leaning_errors``):
the noise a margin must clear.

The case fails (``status = "error"``, the message in ``error``) when tracing or the search
fails or the search runs past ``search_timeout_s`` (it runs in a child process that is
killed then, ``bench.child``); the other contenders are still priced when the model traced.
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any

from autoplan.baselines import RECIPES, baseline, credible
from autoplan.baselines.published import NAME as PUBLISHED
from autoplan.baselines.tuning import tuned
from autoplan.bench.child import SearchFailed, SearchTimeout, search_with_limit
from autoplan.bench.grid import respects_nvlink, search_grid
from autoplan.bench.suite import Case
from autoplan.cost import Estimate, Estimator
from autoplan.cost.evidence import leaning_errors
from autoplan.cost.params import ranges
from autoplan.cost.uncertainty import Sampler, quantile
from autoplan.errors import UserError
from autoplan.frontend import trace
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from autoplan.search import SearchOptions, SearchResult
from autoplan.workload import load_cluster
from topologies.cluster import Cluster

CONTENDERS = ("auto", "grid") + tuple(RECIPES)
MISMATCH_TOLERANCE = 1e-9      # relative: the search's own estimate vs the harness's re-pricing


def run_case(case: Case, *, workers: int = 0, search_timeout_s: float = 900.0) -> dict:
    """The case's record: its setup, one row per contender, the ratios, and timings (seconds).

    Each step below writes its own keys into the record, in the record's key order."""
    start = time.perf_counter()
    record: dict = {"case": case.to_dict(), "status": "ok", "error": None, "warnings": []}
    try:
        cluster = load_cluster(case.cluster)
        graph = _traced(case, record)
    except Exception as e:          # a failing case is logged, the suite goes on
        return _failed(record, e, start)
    record.update(gpus=cluster.num_gpus, gpu=cluster.gpu.name, nvlink_domain=cluster.nvlink_domain,
                  cluster_name=cluster.name, params=graph.param_count, model_name=graph.model.name)
    estimator = Estimator(graph, cluster)
    rows = {"auto": _auto_row(case, graph, cluster, estimator, record, workers=workers,
                              limit_s=search_timeout_s)}
    rows["grid"] = _grid_row(case, estimator, record)
    rows.update(_recipe_rows(case, graph, cluster, estimator, record))
    record["profile_residuals"] = _residuals(cluster.gpu.name)
    record["contenders"] = [rows[c] for c in CONTENDERS]
    record.update(_ratios(rows))
    # the band against the best credible hand plan; where every credible recipe breaks the NVLink
    # rule (DeepSeek-V3's EP64 across nodes on H100), against the fastest of them regardless
    record["band_hand"] = record["best_hand"] or record["best_hand_any"]
    record.update(_bands(estimator, rows, record["band_hand"], case.global_batch, cluster.num_gpus))
    record["case_s"] = time.perf_counter() - start
    return record


def _traced(case: Case, record: dict) -> BlockGraph:
    t0 = time.perf_counter()
    graph = trace(case.model, seq=case.seq)
    record["trace_s"] = time.perf_counter() - t0
    return graph


# --- contenders -----------------------------------------------------------------------------------

def _auto_row(case: Case, graph: BlockGraph, cluster: Cluster, estimator: Estimator, record: dict, *,
              workers: int, limit_s: float) -> dict:
    """The search's best plan re-priced by the harness; the search's statistics, top plans and
    evidence go to the record, and a search failure fails the case."""
    t0 = time.perf_counter()
    try:
        result = search_with_limit(graph, cluster, global_batch=case.global_batch,
                                   options=SearchOptions(workers=workers), limit_s=limit_s)
        record["search_s"] = result.stats.seconds
        record["search_stats"] = _search_stats(result)
        record["search_top"] = [{"plan": c.plan.to_string(), "step_time_s": c.estimate.step_time_s,
                                 "mfu": c.estimate.mfu} for c in result.candidates]
        best = result.candidates[0]
        record["auto_evidence"] = [f.regime for f in best.evidence]
        record["auto_out_of_sample"] = leaning_errors(best.plan, moe=bool(estimator.info.experts))
        row = _priced("auto", "auto", estimator, best.plan, case.global_batch)
        repriced = row.get("step_time_s")
        if repriced is not None and abs(repriced - best.estimate.step_time_s) > \
                MISMATCH_TOLERANCE * best.estimate.step_time_s:
            record["warnings"].append(f"search priced its best plan at {best.estimate.step_time_s:.6g} s, "
                                      f"the harness's Estimator at {repriced:.6g} s")
        return row
    except Exception as e:
        record["search_s"] = time.perf_counter() - t0
        record["status"], record["error"] = "error", f"search: {_message(e)}"
        return _row("auto", "auto", status="error", error=_message(e))


def _search_stats(result: SearchResult) -> dict:
    return {"meshes_generated": result.stats.space.generated,
            "meshes_evaluated": result.stats.meshes_evaluated,
            "plans_priced": result.stats.plans_priced,
            "pruned_bound": result.stats.pruned_bound,
            "pruned_memory": result.stats.pruned_memory,
            "max_ilp_gap": result.max_ilp_gap,
            "ilp_seconds": sum(i.solve_seconds for i in result.stats.ilps),
            "cpus": os.cpu_count()}


def _grid_row(case: Case, estimator: Estimator, record: dict) -> dict:
    """The best plan of the Megatron grid (``bench.grid``), whose summary goes to the record."""
    grid = search_grid(estimator, case.global_batch, case.grid_cp)
    record["grid"] = grid.to_dict()
    if grid.best is not None:
        return _priced("grid", "grid", estimator, grid.best, case.global_batch)
    why = ("no grid plan fits in HBM" if not grid.fitting else
           "every grid plan that fits breaks the NVLink rule")
    return _row("grid", "grid", status="n/a", error=f"{why} ({grid.valid} valid of {grid.plans})")


def _recipe_rows(case: Case, graph: BlockGraph, cluster: Cluster, estimator: Estimator,
                 record: dict) -> dict[str, dict]:
    """One row per hand-written recipe (``n/a`` where it cannot apply); each one's seconds go to the record."""
    rows: dict[str, dict] = {}
    record["recipe_s"] = {}
    for name in RECIPES:
        t0 = time.perf_counter()
        rows[name] = _recipe_row(name, case, graph, cluster, estimator)
        record["recipe_s"][name] = time.perf_counter() - t0
        rows[name]["credible"] = credible(name, graph)
    return rows


def _recipe_row(name: str, case: Case, graph: BlockGraph, cluster: Cluster, estimator: Estimator) -> dict:
    """The recipe's plan tuned within its family (the published layout as published)."""
    try:
        plan = baseline(name, graph, cluster, seq=case.seq, global_batch=case.global_batch, estimator=estimator)
        best = plan if name == PUBLISHED else tuned(plan, estimator, case.global_batch)
    except UserError as e:
        return _row(name, "recipe", status="n/a", error=e.problem)
    except Exception as e:
        return _row(name, "recipe", status="error", error=_message(e))
    row = _priced(name, "recipe", estimator, best, case.global_batch)
    row["recipe_plan"] = plan.to_string()
    row["memory_model_miss"] = name == PUBLISHED and row["status"] == "ok" and not row["fits"]
    return row


# --- rows -----------------------------------------------------------------------------------------

def _row(contender: str, kind: str, *, status: str, error: str | None = None, plan: Plan | None = None,
         estimate: Estimate | None = None) -> dict:
    row: dict[str, Any] = {"contender": contender, "kind": kind, "status": status, "error": error,
           "plan": plan.to_string() if plan else None, "step_time_s": None, "tokens_per_s": None, "mfu": None,
           "memory_gib": None, "hbm_gib": None, "fits": None, "respects_nvlink": None, "violations": [],
           "bubble_fraction": None, "time_breakdown_s": {}, "credible": None}
    if estimate is not None:
        row.update(step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s, mfu=estimate.mfu,
                   memory_gib=estimate.memory_gib, hbm_gib=estimate.hbm_gib, fits=estimate.fits,
                   respects_nvlink=respects_nvlink(estimate),
                   violations=[v.rule for v in estimate.violations],
                   bubble_fraction=estimate.bubble_fraction, time_breakdown_s=dict(estimate.time_breakdown_s))
    return row


def _priced(contender: str, kind: str, estimator: Estimator, plan: Plan, global_batch: int) -> dict:
    try:
        e = estimator.estimate(plan, global_batch)
    except UserError as err:
        return _row(contender, kind, status="error", error=err.problem, plan=plan)
    return _row(contender, kind, status="ok", plan=plan, estimate=e)


def usable(row: dict, *, nvlink: bool = True) -> bool:
    """A contender that counts for a ratio: priced, fits (or a published layout, which ran: its
    ``memory_model_miss``), and (by default) respects NVLink."""
    fits = bool(row["fits"]) or bool(row.get("memory_model_miss"))
    return row["status"] == "ok" and fits and (row["respects_nvlink"] or not nvlink)


def _ratios(rows: dict[str, dict]) -> dict:
    auto = rows["auto"]
    recipes = [rows[n] for n in RECIPES]

    def best(candidates):
        ok = [r for r in candidates if r["tokens_per_s"] is not None]
        return max(ok, key=lambda r: (r["tokens_per_s"], r["contender"])) if ok else None

    credible_recipes = [r for r in recipes if r.get("credible", True)]
    hand = best([r for r in credible_recipes if usable(r)])
    hand_any = best([r for r in credible_recipes if usable(r, nvlink=False)])
    # what the hand baseline was before a published layout counted whatever the memory model says
    hand_fits = best([r for r in credible_recipes if usable(r) and r["fits"]])
    grid = rows["grid"] if usable(rows["grid"]) else None

    def ratio(other):
        if not usable(auto) or other is None:
            return None
        return auto["tokens_per_s"] / other["tokens_per_s"]

    return {"best_hand": hand["contender"] if hand else None,
            "best_hand_any": hand_any["contender"] if hand_any else None,
            "best_hand_fits": hand_fits["contender"] if hand_fits else None,
            "auto_vs_hand": ratio(hand), "auto_vs_hand_any": ratio(hand_any), "auto_vs_hand_fits": ratio(hand_fits),
            "auto_vs_grid": ratio(grid)}


def _bands(estimator: Estimator, rows: dict[str, dict], hand: str | None, global_batch: int, gpus: int) -> dict:
    """auto/hand over the paired parameter samples: p10/p50/p90 and P(auto faster) (module docstring),
    and each plan's own step-time p10/p90 (``auto_step_s_p10`` …, ``hand_step_s_p90``)."""
    out: dict[str, float | None] = {"auto_vs_hand_p10": None, "auto_vs_hand_p50": None, "auto_vs_hand_p90": None,
                                    "p_auto_beats_hand": None, "auto_step_s_p10": None, "auto_step_s_p90": None,
                                    "hand_step_s_p10": None, "hand_step_s_p90": None}
    if hand is None or not usable(rows["auto"]):
        return out
    sampler = Sampler(estimator)
    steps = []
    for name in ("auto", hand):
        plan = Plan.parse(rows[name]["plan"], num_gpus=gpus)
        steps.append(sampler.band(plan, global_batch, estimator.estimate(plan, global_batch)).step_s)
    ratios = [h / a for a, h in zip(*steps)]
    out.update({f"auto_vs_hand_p{round(q * 100)}": quantile(ratios, q) for q in (0.1, 0.5, 0.9)})
    out["p_auto_beats_hand"] = sum(r > 1.0 for r in ratios) / len(ratios)
    for who, samples in zip(("auto", "hand"), steps):
        out.update({f"{who}_step_s_p{round(q * 100)}": quantile(samples, q) for q in (0.1, 0.9)})
    return out


def _residuals(gpu: str) -> dict:
    """The GPU profile's GEMM-efficiency range as residuals (multiplier − 1) and its source: the
    cost model's error on the public rows of that GPU (``cost.params.ranges``)."""
    r = next(x for x in ranges(gpu) if x.name == "gemm_peak")
    return {"low": r.low - 1.0, "high": r.high - 1.0, "source": r.source}


def _message(e: BaseException) -> str:
    """One line for the log: ``UserError``'s problem, or the exception type, text and where it was raised."""
    if isinstance(e, UserError):
        return e.problem
    if isinstance(e, (SearchTimeout, SearchFailed)):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{at}"


def _failed(record: dict, e: BaseException, start: float) -> dict:
    record.update(status="error", error=_message(e), contenders=[], case_s=time.perf_counter() - start,
                  best_hand=None, best_hand_any=None, best_hand_fits=None, auto_vs_hand=None, auto_vs_hand_any=None,
                  auto_vs_hand_fits=None, auto_vs_grid=None,
                  auto_vs_hand_p10=None, auto_vs_hand_p50=None, auto_vs_hand_p90=None, p_auto_beats_hand=None)
    return record
