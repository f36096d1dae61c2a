"""What every study shares: the grid point, the sweep that searches it, the error it leans on.

A study (``q1`` … ``q5``) is a grid of ``Setting``s — model, cluster, sequence, batch and the
``Constraints`` the search is held to — and an analysis of the points the sweep finds there.
Every point is the search's best plan under its setting (``SearchOptions(objective="point",
top_k=1)``: the fastest plan by point estimate, with its p10–p90 band over the run's paired
parameter samples), never a fixed recipe; a setting no plan fits is a point with status
``no-fit`` and the search's reason.

Two points of one GPU kind are priced on the *same* samples (``cost.uncertainty``: the draws
depend on the GPU's parameter ranges and the seed only), so the ratio of their step times has a
paired band (``ratio_band``): how sure the cost model is of a margin given its own parameter
ranges.  What it cannot say about itself — how far off it is on runs it was not fitted to — is
the leave-one-source-out error by regime (``costmodels/cross_validation.json``, written by
``python experiments/validate_published.py --cv --write``), which every answer quotes for the
regimes its plans lean on (``regimes``, ``leans_on``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from autoplan.cost import rounded
from autoplan.cost.uncertainty import quantile
from autoplan.errors import UserError
from autoplan.search import Constraints, SearchOptions, search
from costmodels.compute import PROFILE_DIR
from topologies.cluster import Cluster

log = logging.getLogger(__name__)

ERROR_FILE = os.path.join(os.path.dirname(PROFILE_DIR), "cross_validation.json")
ZERO_BUBBLE_SCHEDULES = ("zb-h1", "zb-h2", "zbv", "dualpipev")
SAMPLES = {"full": 24, "quick": 12, "tiny": 8}   # paired parameter samples per point, by grid size


@dataclass(frozen=True)
class Setting:
    """One grid point: what the search is asked.  ``axes``: the point's grid coordinates (what
    the table and the figure read); ``arm``: which constrained search of the point this is
    (e.g. ``ring`` or ``free``)."""

    axes: dict[str, Any]
    arm: str
    model: str
    cluster: str | Cluster
    seq: int
    global_batch: int
    constraints: Constraints = Constraints()
    zero: tuple[int, ...] = (0, 1, 2, 3)


def model_seq_grid(g: dict[str, Any], arms: dict[str, Constraints]) -> tuple[dict, list[Setting]]:
    """Every (model, sequence) of grid ``g`` (``models``: name → cluster, ``seqs``, ``tokens`` per
    step) searched under each arm's constraints: the grid's description and its settings."""
    settings = [Setting({"model": m, "seq": s}, arm, m, cluster, s, g["tokens"] // s, c)
                for m, cluster in g["models"].items() for s in g["seqs"] for arm, c in arms.items()]
    return {"models": dict(g["models"]), "seqs": list(g["seqs"]), "tokens_per_step": g["tokens"],
            "arms": {a: c.describe() for a, c in arms.items()}}, settings


def cluster_with_nics(name: str, nics_per_node: int) -> Cluster:
    """Cluster ``name`` with ``nics_per_node`` compute NICs per node (the NVLink/IB ratio knob),
    renamed so that no cache keyed on the name mixes the two."""
    from autoplan.workload import load_cluster

    base = load_cluster(name)
    if nics_per_node == base.nics_per_node:
        return base
    return dataclasses.replace(base, nics_per_node=nics_per_node, name=f"{base.name}-{nics_per_node}nic")


def nvlink_ib_ratio(cluster: Cluster) -> float:
    """Per-GPU NVLink bandwidth over per-GPU scale-out bandwidth (line rates, one direction)."""
    return cluster.gpu.nvlink_bw / (cluster.nics_per_node * cluster.nic_bw / cluster.gpus_per_node)


# --- the sweep ----------------------------------------------------------------------------------

class Sweep:
    """Searches settings one after another, tracing each (model, seq) once."""

    def __init__(self, *, workers: int = 0, samples: int = 24, log_line: Callable[[str], None] = print):
        self.workers, self.samples, self.say = workers, samples, log_line
        self._graphs: dict[tuple[str, int], Any] = {}
        self.searches = 0

    def graph(self, model: str, seq: int) -> Any:
        from autoplan.frontend import trace  # torch: only when a study runs

        key = (model, seq)
        if key not in self._graphs:
            self._graphs[key] = trace(model, seq=seq)
        return self._graphs[key]

    def run(self, settings: list[Setting]) -> list[dict]:
        return [self.point(s) for s in settings]

    def point(self, s: Setting) -> dict:
        """The search's best plan under ``s``, as a JSON-able record (``point_record``)."""
        from autoplan.workload import load_cluster

        cluster = load_cluster(s.cluster)
        graph = self.graph(s.model, s.seq)
        options = SearchOptions(objective="point", top_k=1, samples=self.samples, workers=self.workers,
                                zero=s.zero, constraints=s.constraints)
        t0 = time.perf_counter()
        self.searches += 1
        try:
            best = search(graph, cluster, global_batch=s.global_batch, options=options).candidates[0]
        except UserError as err:
            status = "no-mesh" if err.problem.startswith("no mesh") else "no-fit"
            record = point_record(s, cluster, graph, None, time.perf_counter() - t0)
            record.update(status=status, error=err.problem)
            self.say(f"  {describe(s)}: {status}")
            return record
        record = point_record(s, cluster, graph, best, time.perf_counter() - t0)
        self.say(f"  {describe(s)}: {record['compact']}  {record['step_time_s']:.4g} s  MFU {record['mfu']:.1%}")
        return record


def describe(s: Setting) -> str:
    return ", ".join(f"{k} {v}" for k, v in s.axes.items()) + f" [{s.arm}]"


def point_record(s: Setting, cluster: Cluster, graph: Any, best: Any, seconds: float) -> dict:
    """A point's record: its setting, and the plan found (plan string, step time, MFU, memory per
    GPU, p10/p90 band, the band's samples, attention's share, the regimes it leans on)."""
    record: dict[str, Any] = {
        "axes": dict(s.axes), "arm": s.arm, "model": s.model, "model_name": graph.model.name,
        "cluster": cluster.name, "gpus": cluster.num_gpus, "gpu": cluster.gpu.name, "seq": s.seq,
        "global_batch": s.global_batch, "constraint": s.constraints.describe()
        + ("" if s.zero == (0, 1, 2, 3) else f", zero ∈ {{{', '.join(map(str, s.zero))}}}"),
        "status": "ok", "error": None, "search_s": seconds, "plan": None, "compact": None}
    if best is None:
        return record
    e, band = best.estimate, best.band
    record.update(
        plan=best.plan.to_string(), compact=best.plan.to_compact(), step_time_s=e.step_time_s, mfu=e.mfu,
        memory_gib=e.memory_gib, hbm_gib=e.hbm_gib, tokens_per_s=e.tokens_per_s,
        band={"step_time_s_p10": band.step(0.1), "step_time_s_p90": band.step(0.9),
              "mfu_p10": band.mfu(0.1), "mfu_p90": band.mfu(0.9)},
        samples_s=list(band.step_s), attention_share=e.attention_time_share,
        bubble_fraction=e.bubble_fraction, time_breakdown_s=dict(e.time_breakdown_s),
        tp=best.plan.tp, cp=best.plan.cp, pp=best.plan.pp, dp=best.plan.dp, sp=best.plan.sp,
        zero=best.plan.zero, mbs=best.plan.mbs, cp_algo=best.plan.cp_algo, schedule=best.plan.schedule,
        recompute=list(best.plan.recompute), evidence=[f.regime for f in best.evidence],
        regimes=list(regimes(best.plan, moe=bool(graph.model.experts))))
    return record


# --- margins and the error they must clear -------------------------------------------------------

def ok(p: dict | None) -> TypeGuard[dict]:
    return p is not None and p.get("status") == "ok"


def ratio_band(a: dict, b: dict) -> dict[str, float]:
    """Step time of ``a`` over ``b``: at the point and its p10/p50/p90 over the paired samples."""
    ratios = [x / y for x, y in zip(a["samples_s"], b["samples_s"])]
    return {"point": a["step_time_s"] / b["step_time_s"], "p10": quantile(ratios, 0.1),
            "p50": quantile(ratios, 0.5), "p90": quantile(ratios, 0.9)}


def regimes(plan: Any, *, moe: bool) -> tuple[str, ...]:
    """The validation regimes (``cross_validation.REGIMES``) a plan leans on: context
    parallelism, a zero-bubble schedule, ZeRO-2/3 data parallelism (the FSDP rows), Megatron-
    style TP/PP (or plain data parallelism with ZeRO ≤ 1, which the Megatron rows also run), MoE."""
    out = []
    sharded = plan.zero >= 2 and plan.dp * plan.cp > 1
    if plan.tp > 1 or plan.pp > 1 or not sharded:
        out.append("megatron")
    if sharded:
        out.append("fsdp")
    if plan.pp > 1 and plan.schedule in ZERO_BUBBLE_SCHEDULES:
        out.append("schedule")
    if plan.cp > 1:
        out.append("cp")
    if moe:
        out.append("moe")
    if getattr(plan, "precision", "bf16") != "bf16":
        out.append("fp8-bf16")
    return tuple(out)


def load_errors(path: str = ERROR_FILE) -> dict[str, dict]:
    """Per regime: title, rows, in-sample and out-of-sample mean and max |error| of the step time."""
    try:
        with open(path) as f:
            regimes_ = json.load(f)["regimes"]
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"cannot read the out-of-sample errors in {path}: {e}",
                        "run `python experiments/validate_published.py --cv --write` to write it") from None
    return dict(regimes_)


def load_pairs(regime: str, path: str = ERROR_FILE) -> list[dict]:
    """The published pairs of ``regime`` (two layouts of one group, measured and predicted ratio)."""
    with open(path) as f:
        return list(json.load(f).get("pairs", {}).get(regime, []))


def plan_fields(plan: str) -> dict[str, str]:
    """``tp=1,cp=16,cp_algo=usp`` as a dict of strings (the pair files' plans, read without parsing)."""
    return dict(kv.split("=", 1) for kv in plan.split(",") if "=" in kv)


def leans_on(points: list[dict], errors: dict[str, dict]) -> list[dict]:
    """The regimes the plans found lean on, each with how many points and its out-of-sample error."""
    counts: dict[str, int] = {}
    for p in points:
        for r in p.get("regimes") or ():
            counts[r] = counts.get(r, 0) + 1
    return [{"regime": r, "title": errors[r]["title"], "points": n,
             "out_of_sample_mean": errors[r]["out_of_sample_mean"], "out_of_sample_max": errors[r]["out_of_sample_max"],
             "in_sample_mean": errors[r]["in_sample_mean"], "rows": errors[r]["rows"]}
            for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def error_of(regime_names: list[str] | tuple[str, ...], errors: dict[str, dict]) -> tuple[float, str]:
    """The largest out-of-sample mean error among ``regime_names`` and its regime."""
    worst = max(regime_names, key=lambda r: errors[r]["out_of_sample_mean"])
    return errors[worst]["out_of_sample_mean"], worst


def leans_text(leaning: list[dict]) -> str:
    """``cp 13.9 % (19 rows), megatron 6.6 % (21 rows)``: what an answer states it leans on."""
    return ", ".join(f"{x['regime']} {x['out_of_sample_mean']:.1%} out of sample ({x['rows']} rows)"
                     for x in leaning)


def pct(x: float) -> str:
    return f"{x:+.1%}"


@dataclass
class Study:
    """A study's outcome before it is written: the answer, the grid, the points, the rules and
    the extra keys its figure and table read."""

    question: str
    title: str
    answer: str
    grid: dict[str, Any]
    points: list[dict]
    leans_on: list[dict]
    rules: list[dict]
    findings: list[dict] = field(default_factory=list)
    table: str = ""
    headline: str = ""          # the answer in one line (README's "What autoplan finds")

    def to_dict(self, *, command: str, size: str, seconds: float, searches: int) -> dict:
        return rounded({"question": self.question, "title": self.title, "command": command, "size": size,
                        "answer": self.answer, "headline": self.headline, "grid": self.grid, "points": self.points,
                        "leans_on": self.leans_on,
                        "rules": self.rules, "findings": self.findings, "seconds": seconds, "searches": searches})


# --- grouping points ----------------------------------------------------------------------------

Key = tuple[tuple[str, Any], ...]


def key_of(axes: dict[str, Any]) -> Key:
    return tuple(axes.items())


def scenarios(points: list[dict]) -> dict[Key, dict[str, dict]]:
    """Points grouped by their grid coordinates (``axes``), each group by arm, in grid order."""
    out: dict[Key, dict[str, dict]] = {}
    for p in points:
        out.setdefault(key_of(p["axes"]), {})[p["arm"]] = p
    return out


def ranked(arms: dict[str, dict]) -> list[tuple[str, dict]]:
    """The arms that found a plan, fastest first (ties: by name)."""
    return sorted(((a, p) for a, p in arms.items() if ok(p)), key=lambda ap: (ap[1]["step_time_s"], ap[0]))


def grid_study(question: str, title: str, sweep: Sweep, errors: dict[str, dict], grid: tuple[dict, list[Setting]],
               *, finding: Callable[[dict, dict[str, dict], dict[str, dict]], dict],
               rules: Callable[[list[dict]], list[dict]],
               answer: Callable[[list[dict], list[dict], list[dict], dict], str],
               table: Callable[[list[dict]], str], headline: Callable[[list[dict], list[dict]], str]) -> Study:
    """A grid study's skeleton: search every setting of ``grid`` (its description and settings),
    group the points by their grid coordinates, and analyse them — ``finding(axes, arms, errors)``
    per scenario, ``rules(findings)`` (the practitioner rules against the search),
    ``answer(findings, leans_on, rules, description)``, ``table(findings)`` and
    ``headline(findings, rules)`` (the answer in one line)."""
    description, settings = grid
    points = sweep.run(settings)
    findings = [finding(dict(k), arms, errors) for k, arms in scenarios(points).items()]
    leaning = leans_on([p for p in points if ok(p)], errors)
    checked = rules(findings)
    return Study(question, title, answer(findings, leaning, checked, description), description, points, leaning,
                 checked, findings, table(findings), headline(findings, checked))


def margin(slow: dict, fast: dict, errors: dict[str, dict]) -> dict[str, Any]:
    """How much slower ``slow`` is than ``fast`` (point and paired p10/p90, as fractions), and
    whether that is inside the out-of-sample error of the regimes the two plans lean on."""
    r = ratio_band(slow, fast)
    error, regime = error_of(sorted(set(slow["regimes"]) | set(fast["regimes"])), errors)
    return {"margin": r["point"] - 1, "margin_p10": r["p10"] - 1, "margin_p90": r["p90"] - 1,
            "error": error, "error_regime": regime, "inside_error": r["point"] - 1 < error,
            "inside_band": r["p10"] <= 1.0}


def seq_label(seq: int) -> str:
    return f"{seq // 1024}K" if seq % 1024 == 0 else f"{seq:,}"


def rule_sentence(rule: str, rules: list[dict]) -> str:
    """How a practitioner rule fares against the search: agreements, and each disagreement with
    its numbers, saying whether going the rule's way costs more than the out-of-sample error."""
    judged = [r for r in rules if r["agrees"] is not None]
    if not judged:
        return f"The rule \"{rule}\" does not apply to any scenario here. "
    wrong = [r for r in judged if not r["agrees"]]
    text = f"The rule \"{rule}\" agrees with the search's choice in {len(judged) - len(wrong)} of {len(judged)}"
    if not wrong:
        return text + ". "
    text += "; where it disagrees, " + "; ".join(f"{r['scenario']}: {r['says']}, but {r['finds']}" for r in wrong)
    moot = [r for r in wrong if not r.get("matters")]
    if moot:
        text += (f" — in {len(moot)} of these {len(wrong)} the rule's way is within the out-of-sample error of the "
                 "search's, so the model cannot call the rule wrong there")
    return text + ". "


def model_label(model: str) -> str:
    """A zoo name as it is; a family spec by its family and size (``llama 4L h768 12q/4kv``)."""
    if ":" not in model:
        return model
    family, _, rest = model.partition(":")
    keys = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
    heads = f" {keys['heads']}q/{keys.get('kv_heads', keys['heads'])}kv" if "heads" in keys else ""
    return f"{family} {keys.get('layers', '?')}L h{keys.get('hidden', '?')}{heads}"
