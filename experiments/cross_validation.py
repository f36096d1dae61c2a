"""Leave-one-source-out validation of the cost model's fitted parameters, and their inventory.

    python experiments/validate_published.py --cv [--write] [--json]

``--write`` also writes the error by regime to ``costmodels/cross_validation.json``
(``error_file``): what ``autoplan study`` quotes beside each answer (the package never imports
this script; ``tests/experiments/test_cross_validation.py`` checks the file against it).

A *source* is one publication or data set (``published_regimes.SOURCES``).  For each source S in
turn, every fit whose rows S priced depends on is redone without S's rows (coordinate descent
over the fit's grid, starting at the shipped values; a fit left with no row takes its
parameters' priors), and S's rows are priced with the refitted values: the *out-of-sample*
error.  The *in-sample* error prices every row with the shipped values.  Both are reported per
regime; a source that no fit uses is out of sample by construction (the two errors agree).

The fits (``FITS``) are the project's fit scripts' objectives, written once here:

* ``a100``: GEMM peak fraction, GEMM half-efficiency dim and elementwise fusion of
  ``costmodels/profiles/a100.yaml`` on the Megatron A100 rows (SC21 Table 1, Korthikanti Table 5
  and §6), each row's unpublished micro-batch and virtual stages tuned by the model
  (``validate_published.price``): ``fit_a100_profile.py``.
* ``h100``: GEMM peak fraction, flash-attention forward fraction (backward tied at the published
  0.45/0.55 ratio) and fusion of ``h100.yaml`` on the public H100 rows of regime_runs.json:
  ``fit_h100_profile.py``.
* ``stack``: the Megatron-DeepSpeed stack's GPU time per kernel and host floor per launch
  (``a100-megatron-deepspeed.yaml``) on vTrain's single-node runs (every ``VTRAIN_EVERY``-th
  row): ``fit_host_floor.py``.
* ``pipeline-engine``: Megatron-LM's pipeline-engine host time per send/receive (``a100.yaml``),
  on the A100 Megatron-LM rows with pp > 1: the Zero Bubble rows (its sail-sg fork), SC21 and
  Korthikanti.
* ``h100-fp8``: the large-FP8-GEMM fraction of the FP8 peak (``h100.yaml``), on the BF16/FP8
  pairs of FP8-LM and llm-foundry: its objective is the pairs' ratio error, mean
  |predicted ratio / measured ratio − 1| (the FP8 mechanism alone, not the BF16 error both
  halves share).
* ``h100-moe``: the Megatron-Core MoE stack's host parameters of ``h100.yaml`` (host time per
  launch of a synchronized MoE layer, the GPU's idle time at each MoE forward dispatch, the
  pipeline engine's host time per send/receive an MoE model exposes; ``autoplan.cost.ep``) on the
  MoE rows of the Megatron-Core model zoo and Megatron-Bridge.  ``b200.yaml`` ships the same
  values (the same host stack; ``MOE_HOST``): a fold prices the B200 MoE rows with the refitted
  ones too, so Megatron-Bridge's B200 rows are out of sample when it is left out.

Objective otherwise: mean |predicted / published − 1| over the fit's rows (a row the model
cannot price or fit is left out of the mean, as the fit scripts do).  Not refitted here: the vTrain node's
NVLink figures (``fit_nccl_lut.py``), fitted to nccl-tests look-up tables of that node, a
microbenchmark of the hardware and no training run; they are in the inventory.  Not fitted any
more: the torchtitan A100 cluster's NICs per node (the AWS instance it ran on,
``published_regimes.TORCHTITAN_A100_NETWORK``) and the pipeline engine's host time per
send/receive (worth 0.1 point on vTrain's rows once the per-kernel GPU time is refitted).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import yaml

import published_regimes as pr
import published_regimes3 as p3
import validate_published as vp
from autoplan.cost import EstimateOptions
from costmodels.compute import PROFILE_DIR

VTRAIN_EVERY = 6
"""Every 6th vTrain row (240 of 1,440) in the ``stack`` fit and the report: the fit script
uses every 3rd; 240 rows keep the mean within 0.2 points of all 1,440 (``--cv`` prints both)."""
H100_BWD_OVER_FWD = 0.45 / 0.55
MEGATRON_SOURCES = {"SC21 T1": "sc21", "Korthikanti T5": "korthikanti", "Korthikanti §6": "korthikanti"}


@dataclass(frozen=True)
class Parameter:
    """One fitted parameter: where it lives, its grid, and what it means."""

    name: str                        # "<fit>.<field>"
    shipped: float
    grid: tuple[float, ...]
    plausible: tuple[float, float]
    prior: float                     # its value when no row constrains it
    meaning: str


@dataclass(frozen=True)
class Fit:
    """Parameters fitted together on the rows of some sources."""

    name: str
    parameters: tuple[Parameter, ...]
    sources: tuple[str, ...]
    objective: str = "step"          # step: mean |step error|; pairs: mean |pair-ratio error|


@dataclass(frozen=True)
class Case:
    """One published row to price: its source, report regime and measured seconds."""

    source: str
    regime: str
    ident: str
    published_s: float
    row: vp.Row | pr.RegimeRow


@dataclass(frozen=True)
class Result:
    case: Case
    predicted_s: float | None        # None: the model cannot price it or it does not fit

    @property
    def error(self) -> float | None:
        return None if self.predicted_s is None else self.predicted_s / self.case.published_s - 1.0


def _yaml_value(path: str, key: str) -> float:
    with open(os.path.join(PROFILE_DIR, path)) as f:
        return float(yaml.safe_load(f)[key])


def _fits() -> tuple[Fit, ...]:
    a100, h100, stack = "a100.yaml", "h100.yaml", "a100-megatron-deepspeed.yaml"
    return (
        Fit("a100", (
            Parameter("a100.gemm_peak_fraction", _yaml_value(a100, "gemm_peak_fraction"),
                      (0.70, 0.72, 0.74, 0.76, 0.78, 0.80), (0.6, 0.85), 0.76,
                      "large bf16 GEMM throughput / dense peak (cuBLAS reaches ~0.8)"),
            Parameter("a100.gemm_half_dim", _yaml_value(a100, "gemm_half_dim"), (64, 96, 128, 192, 256),
                      (32, 512), 128, "GEMM dim at which efficiency is half the peak fraction"),
            Parameter("a100.fusion", _yaml_value(a100, "fusion"), (0.5, 0.75, 1.0), (0.3, 1.0), 0.5,
                      "share of elementwise HBM traffic left after kernel fusion")),
            ("sc21", "korthikanti")),
        Fit("h100", (
            Parameter("h100.gemm_peak_fraction", _yaml_value(h100, "gemm_peak_fraction"),
                      (0.66, 0.70, 0.74, 0.76, 0.78, 0.80), (0.6, 0.85), 0.76,
                      "large bf16 GEMM throughput / dense peak"),
            Parameter("h100.attention_fwd_fraction", _yaml_value(h100, "attention_fwd_fraction"),
                      (0.30, 0.35, 0.40, 0.45, 0.50, 0.55), (0.3, 0.75), 0.55,
                      "flash-attention forward throughput / dense peak (FA2 0.35-0.5, FA3 0.6-0.75)"),
            Parameter("h100.fusion", _yaml_value(h100, "fusion"), (0.5, 0.75, 1.0), (0.3, 1.0), 0.5,
                      "share of elementwise HBM traffic left after kernel fusion")),
            ("torchtitan-h100", "llama3-paper", "ngc-nemotron")),
        Fit("stack", (
            Parameter("stack.overhead_s", _yaml_value(stack, "overhead_s"), (20e-6, 26e-6, 30e-6, 34e-6), (2e-6, 50e-6),
                      _yaml_value(a100, "overhead_s"), "GPU time per eager kernel beyond its HBM traffic (s)"),
            Parameter("stack.host_floor_s", _yaml_value(stack, "host_floor_s"), (52e-6, 55e-6, 58e-6),
                      (5e-6, 100e-6), 0.0, "host time per launched op of the eager stack (s)")),
            ("vtrain",)),
        Fit("pipeline-engine", (
            Parameter("pipeline.p2p_host_s", _yaml_value(a100, "p2p_host_s"), (0.0, 1e-4, 2e-4, 3e-4, 4.5e-4),
                      (0.0, 1e-3), 0.0, "Megatron-LM's pipeline-engine host time per send/receive "
                      "instruction (s), a100.yaml"),),
            ("zero-bubble", "sc21", "korthikanti")),
        Fit("h100-fp8", (
            Parameter("h100.fp8_gemm_peak_fraction", _yaml_value(h100, "fp8_gemm_peak_fraction"),
                      (0.5, 0.55, 0.6, 0.65, 0.7), (0.4, 0.85), 0.7,
                      "large FP8 GEMM throughput / FP8 dense peak (prior: the BF16 fraction)"),),
            ("fp8-lm", "llm-foundry"), objective="pairs"),
        Fit("h100-moe", (
            Parameter("h100.moe_host_floor_s", _yaml_value(h100, "moe_host_floor_s"),
                      (20e-6, 25e-6, 30e-6, 35e-6, 40e-6),
                      (5e-6, 100e-6), 0.0,
                      "host time per launch of an MoE layer, which syncs host and GPU (s); b200.yaml the same"),
            Parameter("h100.moe_sync_s", _yaml_value(h100, "moe_sync_s"), (0.0, 0.6e-3, 1.2e-3, 1.8e-3, 2.4e-3),
                      (0.0, 5e-3), 0.0,
                      "GPU idle at an MoE layer's forward dispatch while the host takes its turn (s); "
                      "b200.yaml the same"),
            Parameter("h100.moe_p2p_host_s", _yaml_value(h100, "moe_p2p_host_s"), (0.0, 300e-6, 450e-6, 600e-6),
                      (0.0, 1e-3), 0.0,
                      "pipeline-engine host time per send/receive an MoE model exposes (s); b200.yaml the same")),
            ("mcore-zoo", "megatron-bridge")),
    )


FITS = _fits()
PARAMETERS = {p.name: p for f in FITS for p in f.parameters}
SHIPPED = {name: p.shipped for name, p in PARAMETERS.items()}


# --- the rows ---------------------------------------------------------------------------------

def cases() -> list[Case]:
    """Every public row the model prices, with its source and report regime."""
    out = [Case(MEGATRON_SOURCES[r.source], "megatron", f"{r.source} {r.name}", r.published_s, r)
           for r in vp.rows()]
    regime_of = {"fsdp": "fsdp", "memory-must-fit": "megatron"}
    for r in pr.regime_json_rows():
        out.append(Case(r.source, regime_of[r.regime], r.ident, r.published_s, r))
    out += [Case("vtrain", "single-node", r.ident, r.published_s, r) for r in pr.vtrain_rows()[::VTRAIN_EVERY]]
    priced, _ = p3.rows()
    out += [Case(r.source, "fp8-bf16" if r.regime == "fp8" else r.regime, r.ident, r.published_s, r)
            for r in priced]
    return out


# --- pricing under a parameter point ----------------------------------------------------------

def _profile_file(base: str, fields: dict) -> str:
    """A profile YAML: ``base`` (a name in ``PROFILE_DIR`` or a path) with ``fields`` replaced,
    named by its content (a cached profile is keyed on its path, so one path never holds two
    contents)."""
    with open(os.path.join(PROFILE_DIR, base)) as f:
        data = yaml.safe_load(f)
    data.update(fields)
    text = yaml.safe_dump(data, sort_keys=True)
    path = os.path.join(tempfile.gettempdir(), "autoplan-cv",
                        f"{os.path.basename(base)[:-5]}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return path


def _gpu_fields(point: dict[str, float], gpu: str) -> dict:
    fields = {k.split(".", 1)[1]: point[k] for k in point if k.split(".", 1)[0] == gpu}
    if "gemm_half_dim" in fields:
        fields["gemm_half_dim"] = int(fields["gemm_half_dim"])
    if gpu == "h100":
        fields["attention_bwd_fraction"] = round(fields["attention_fwd_fraction"] * H100_BWD_OVER_FWD, 3)
    return fields


MOE_HOST = ("moe_host_floor_s", "moe_sync_s", "moe_p2p_host_s")
"""The MoE host parameters ``b200.yaml`` takes from the ``h100-moe`` fit (module docstring)."""


def _profiles(point: dict[str, float]) -> dict[str, str]:
    stack = {k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("stack.")}
    a100 = {**_gpu_fields(point, "a100"), "p2p_host_s": point["pipeline.p2p_host_s"]}
    return {"a100": _profile_file("a100.yaml", a100),
            "h100": _profile_file("h100.yaml", _gpu_fields(point, "h100")),
            "b200": _profile_file("b200.yaml", {k: point[f"h100.{k}"] for k in MOE_HOST}),
            "stack": _profile_file("a100-megatron-deepspeed.yaml", {**_gpu_fields(point, "a100"), **stack})}


def _regime_options(row: pr.RegimeRow, profiles: dict[str, str]) -> EstimateOptions:
    if row.source == "vtrain":
        return dataclasses.replace(pr.VTRAIN_OPTIONS, profile=profiles["stack"])
    gpu = pr.cluster(row.cluster).gpu.name
    kind = "a100" if gpu.startswith("a100") else "h100" if gpu.startswith("h") else "b200" if gpu == "b200" else ""
    profile = profiles.get(kind)
    return pr.row_options(row, EstimateOptions(profile=profile))


def price(selected: list[Case], point: dict[str, float]) -> list[Result]:
    """Every case priced with the parameters of ``point`` (a full name -> value mapping)."""
    return price_with_profiles(selected, _profiles(point))


def price_with_profiles(selected: list[Case], profiles: dict[str, str]) -> list[Result]:
    """Every case priced with the profile files ``profiles`` (``_profiles``'s keys: a100, h100,
    b200, stack)."""
    pr._ESTIMATORS.clear()
    models: dict = {}
    out = []
    for case in selected:
        row = case.row
        if isinstance(row, vp.Row):
            e = vp.price(row, models, EstimateOptions(overlap_grad_reduce=False, profile=profiles["a100"]))
            out.append(Result(case, None if e is None else e.step_time_s))
            continue
        priced = pr.price_or_why(row, _regime_options(row, profiles))
        out.append(Result(case, priced.predicted_s if isinstance(priced, pr.Priced) else None))
    pr._ESTIMATORS.clear()
    return out


def pair_residuals(results: list[Result], plan_has: str = "precision=fp8") -> list[float]:
    """Predicted ratio / measured ratio − 1 of every pair among the priced ``results``
    (``published_regimes3.pairs``: each row of a group against its first) whose other row's
    plan contains ``plan_has`` (default: the BF16/FP8 pairs, FP8 over BF16)."""
    priced = [pr.Priced(r.case.row, r.predicted_s, 0.0, True) for r in results
              if isinstance(r.case.row, pr.RegimeRow) and r.predicted_s is not None]
    plans = {p.row.ident: p.row.plan for p in priced}
    return [q.predicted / q.measured - 1.0 for q in p3.pairs(priced) if plan_has in plans[q.other]]


def pair_error(results: list[Result]) -> float:
    """Mean |predicted ratio / measured ratio − 1| over the BF16/FP8 pairs among ``results``."""
    errs = [abs(e) for e in pair_residuals(results)]
    return sum(errs) / len(errs) if errs else float("nan")


def mean_abs(results: list[Result]) -> float:
    errs = [abs(r.error) for r in results if r.error is not None]
    return sum(errs) / len(errs) if errs else float("nan")


# --- fitting ----------------------------------------------------------------------------------

def refit(fit: Fit, rows: list[Case], start: dict[str, float],
          objective: Callable[[list[Case], dict[str, float]], float] | None = None) -> dict[str, float]:
    """``start`` with ``fit``'s parameters moved to the grid point that minimises the mean |error|
    of ``rows``: coordinate descent (each parameter over its grid, the others held) until no
    move improves by more than 1e-4; the priors where ``rows`` is empty."""
    point = dict(start)
    if not rows:
        return point | {p.name: p.prior for p in fit.parameters}
    if objective is None:
        measure = pair_error if fit.objective == "pairs" else mean_abs
        objective = lambda rs, pt: measure(price(rs, pt))         # noqa: E731
    best = objective(rows, point)
    improved = True
    while improved:
        improved = False
        for p in fit.parameters:
            for value in p.grid:
                if value == point[p.name]:
                    continue
                trial = point | {p.name: value}
                score = objective(rows, trial)
                if score < best - 1e-4:
                    best, point, improved = score, trial, True
    return point


def depends_on(case: Case, fit: Fit) -> bool:
    """Whether ``case``'s price reads ``fit``'s parameters."""
    gpu = "a100" if isinstance(case.row, vp.Row) else pr.cluster(case.row.cluster).gpu.name
    if fit.name == "a100":
        return gpu.startswith("a100") or case.source == "vtrain"
    if fit.name == "h100":
        return gpu.startswith("h")
    if fit.name == "stack":
        return case.source == "vtrain"
    if fit.name == "pipeline-engine":
        return gpu.startswith("a100") and case.source != "vtrain"
    if fit.name == "h100-moe":
        return gpu.startswith(("h", "b200")) and case.regime == "moe"
    return fit.name == "h100-fp8" and gpu.startswith("h") and "precision=" in getattr(case.row, "plan", "")


@dataclass(frozen=True)
class Fold:
    """One source left out: the parameters refitted without it and its rows priced with them."""

    source: str
    point: dict[str, float]
    results: tuple[Result, ...]


def fold(source: str, everything: list[Case]) -> Fold:
    """Leave ``source`` out: refit every fit its rows depend on, price its rows."""
    own = [c for c in everything if c.source == source]
    point = dict(SHIPPED)
    for fit in FITS:
        if not any(depends_on(c, fit) for c in own):
            continue
        if source not in fit.sources:
            continue            # the fit never saw this source: its values are out of sample already
        rows = [c for c in everything if c.source in fit.sources and c.source != source]
        point = refit(fit, rows, point)
    return Fold(source, point, tuple(price(own, point)))


# --- the report -------------------------------------------------------------------------------

REGIMES = (("megatron", "Megatron-style TP+PP (SC21, Korthikanti, Llama 3 405B, Nemotron-4)"),
           ("fsdp", "FSDP / ZeRO-3 (torchtitan A100 + H100)"),
           ("single-node", f"single-node small-kernel (vTrain, every {VTRAIN_EVERY}th row)"),
           ("schedule", "pipeline schedules (Zero Bubble paper)"),
           ("cp", "context parallelism (USP paper BF16, NeMo long-sequence FP8)"),
           ("moe", "MoE (the rows the grammar can write, BF16 and FP8)"),
           ("fp8-bf16", "FP8 pairs, both halves (FP8-LM, llm-foundry, Megatron-Bridge)"))


@dataclass(frozen=True)
class Report:
    in_sample: tuple[Result, ...]
    folds: tuple[Fold, ...]

    def out_of_sample(self) -> list[Result]:
        return [r for f in self.folds for r in f.results]


def cross_validate(selected: list[Case] | None = None) -> Report:
    """In-sample results (shipped values) and one fold per source of ``selected``."""
    everything = cases()
    selected = selected if selected is not None else everything
    sources = sorted({c.source for c in selected})
    in_sample = price(selected, SHIPPED)
    folds = []
    for source in sources:
        if not any(source in fit.sources for fit in FITS):
            own = tuple(r for r in in_sample if r.case.source == source)
            folds.append(Fold(source, dict(SHIPPED), own))
            continue
        folds.append(fold(source, everything))
    return Report(tuple(in_sample), tuple(folds))


def _regime_stats(results: list[Result]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for regime, _ in REGIMES:
        members = [r for r in results if r.case.regime == regime]
        errs = [abs(r.error) for r in members if r.error is not None]
        out[regime] = {"rows": len(errs), "unpriced": len(members) - len(errs),
                       "mean_abs": sum(errs) / len(errs) if errs else float("nan"),
                       "max_abs": max(errs) if errs else float("nan")}
    return out


def summary(report: Report) -> dict[str, dict[str, dict[str, float]]]:
    """Per regime: rows, mean and max |error|, in sample and out of sample."""
    return {"in_sample": _regime_stats(list(report.in_sample)),
            "out_of_sample": _regime_stats(report.out_of_sample())}


def regime_table(report: Report) -> str:
    s = summary(report)
    lines = ["| regime | rows | in-sample mean (max) | out-of-sample mean (max) | not priced |",
             "|---|---|---|---|---|"]
    for regime, title in REGIMES:
        i, o = s["in_sample"][regime], s["out_of_sample"][regime]
        lines.append(f"| {title} | {i['rows']} | {i['mean_abs']:.1%} ({i['max_abs']:.1%}) | "
                     f"{o['mean_abs']:.1%} ({o['max_abs']:.1%}) | {i['unpriced']} |")
    return "\n".join(lines) + "\n"


def source_table(report: Report) -> str:
    inside = {r.case.ident: r for r in report.in_sample}
    lines = ["| source left out | rows | in-sample mean | out-of-sample mean | parameters that moved |",
             "|---|---|---|---|---|"]
    for f in report.folds:
        moved = ", ".join(f"{k.split('.', 1)[1]} {SHIPPED[k]:g}→{v:g}" for k, v in f.point.items() if v != SHIPPED[k])
        mine = [inside[r.case.ident] for r in f.results]
        lines.append(f"| {f.source} | {len(f.results)} | {mean_abs(mine):.1%} | {mean_abs(list(f.results)):.1%} | "
                     f"{moved or '—'} |")
    return "\n".join(lines) + "\n"


def rows_by_source(selected: list[Case]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in selected:
        counts[c.source] = counts.get(c.source, 0) + 1
    return counts


def inventory(report: Report) -> str:
    """Each fitted parameter: value, plausible range, meaning, the sources that constrain it and
    the range of its refitted values across folds; a warning where one source decides it."""
    counts = rows_by_source([r.case for r in report.in_sample])
    lines = ["| parameter | value | plausible | across folds | constrained by (rows) | meaning |",
             "|---|---|---|---|---|---|"]
    warnings = []
    for fit in FITS:
        for p in fit.parameters:
            values = [f.point[p.name] for f in report.folds if f.source in fit.sources]
            spread = f"{min(values):g}–{max(values):g}" if values else "—"
            by = ", ".join(f"{s} ({counts.get(s, 0)})" for s in fit.sources)
            lines.append(f"| {p.name} | {p.shipped:g} | {p.plausible[0]:g}–{p.plausible[1]:g} | {spread} | {by} | "
                         f"{p.meaning} |")
            if len(fit.sources) == 1:
                warnings.append(f"warning: {p.name} is decided by one source alone ({fit.sources[0]}); "
                                f"without it the prior {p.prior:g} prices that source")
    nics = pr.TORCHTITAN_A100_NETWORK["nics_per_node"]
    lines.append(f"| torchtitan A100 network ({nics}x HDR 200G-equivalent per node) | fixed | | not refitted | "
                 "cited: AWS p4de, 4x 100G EFA = 400 Gb/s per node (published_regimes.py) | "
                 "the cluster of torchtitan's A100 rows |")
    lines.append("| vtrain-node NVLink (efficiency 0.72, 1.5 µs/step, 48 µs/call) | fixed | | not refitted | "
                 "vTrain's nccl-tests LUTs (448 points) | a microbenchmark of that node (fit_nccl_lut.py) |")
    return "\n".join(lines) + "\n\n" + "\n".join(warnings) + "\n"


ERROR_FILE = os.path.join(os.path.dirname(PROFILE_DIR), "cross_validation.json")
"""Where ``--cv --write`` puts the error by regime for the package to read."""


def error_file(report: Report) -> dict:
    """The error by regime as ``costmodels/cross_validation.json`` holds it: per regime its title,
    rows priced and the mean and max |error| in and out of sample, rounded to 4 decimals."""
    s = summary(report)
    regimes = {}
    for regime, title in REGIMES:
        i, o = s["in_sample"][regime], s["out_of_sample"][regime]
        regimes[regime] = {"title": title, "rows": i["rows"],
                           "in_sample_mean": round(i["mean_abs"], 4), "in_sample_max": round(i["max_abs"], 4),
                           "out_of_sample_mean": round(o["mean_abs"], 4), "out_of_sample_max": round(o["max_abs"], 4)}
    return {"command": "python experiments/validate_published.py --cv --write",
            "what": "leave-one-source-out error of the step time by regime (experiments/RESULTS.md, "
                    "cross_validation): each source left out, every fitted parameter refitted without it; "
                    "pairs: per regime, the measured and out-of-sample predicted ratio of two layouts of one "
                    "published group (what a ranking between them rests on)",
            "regimes": regimes, "pairs": pair_ratios(report)}


PAIR_REGIMES = ("cp", "schedule")
"""The regimes whose pairs the error file carries: two layouts of one published group, where
a ranking between CP algorithms or pipeline schedules rests on the pair's ratio."""


def pair_ratios(report: Report) -> dict[str, list[dict]]:
    """Per regime of ``PAIR_REGIMES``, every pair of one published group
    (``published_regimes3.pairs``: each row against the group's first) with both plans, the
    measured and the out-of-sample predicted ratio (other / base), rounded to 4 decimals."""
    rows: dict[str, pr.RegimeRow] = {}
    priced: list[pr.Priced] = []
    regime: dict[str, str] = {}
    for r in report.out_of_sample():
        row = r.case.row
        if r.predicted_s is None or not isinstance(row, pr.RegimeRow) or r.case.regime not in PAIR_REGIMES:
            continue
        rows[r.case.ident], regime[r.case.ident] = row, r.case.regime
        priced.append(pr.Priced(row, r.predicted_s, 0.0, True))
    out: dict[str, list[dict]] = {}
    for q in p3.pairs(priced):
        out.setdefault(regime[q.base], []).append(
            {"group": q.group, "base": q.base, "other": q.other, "base_plan": rows[q.base].plan,
             "other_plan": rows[q.other].plan, "measured": round(q.measured, 4),
             "predicted": round(q.predicted, 4)})
    return out


def write_error_file(report: Report, path: str = ERROR_FILE) -> None:
    import json
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(error_file(report), indent=1, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)


def markdown(report: Report) -> str:
    return ("Error by regime, every parameter fitted on all public rows (in sample) and refitted without "
            "the row's own source (out of sample):\n\n" + regime_table(report)
            + "\nPer source left out:\n\n" + source_table(report)
            + "\nFitted parameters:\n\n" + inventory(report))


# --- the sampled ranges the out-of-sample spread widens ---------------------------------------

RANGES_PATH = os.path.join(os.path.dirname(PROFILE_DIR), "uncertainty_cv.yaml")


@dataclass(frozen=True)
class Widening:
    """One uncertain parameter (``autoplan.cost.params.Params``) whose sampled range the
    out-of-sample residuals of some regimes widen, for one compute profile (``any``: every one).

    ``residual`` says what a residual e is: ``row``, a row's predicted / published − 1 (rows whose
    plan contains ``plan_has``); ``pair``, a pair's predicted / measured ratio − 1
    (``pair_residuals``: the pairs of the selected rows whose other row's plan contains
    ``plan_has``), which leaves out the error both halves share — for a parameter only the other
    half reads (FP8 over BF16: ``fp8_gemm_peak``), the row residual would charge it the BF16
    half's error too.  ``kind`` says how e reads as a multiplier: ``rate`` (a throughput: a row
    priced e too slow is matched by a rate (1 + e)×), ``cost`` (a time: 1/(1 + e)), ``share`` (a
    hidden fraction: only rows priced too fast count, 1 + e, never above 1).  A ``rate`` reads e
    whole, as if the parameter's share of the step were all of it: a lower bound on the width
    (the FP8 GEMMs are about half of an FP8 row's step)."""

    parameter: str
    profile: str
    regimes: tuple[str, ...]
    kind: str
    rows: str                              # which rows (or pairs), in words
    plan_has: str = ""                     # only rows (pairs: other rows) whose plan string contains this
    residual: str = "row"                  # row | pair


WIDENINGS = (
    Widening("gemm_peak", "a100", ("megatron", "fsdp"), "rate", "Megatron-style and FSDP rows on A100"),
    Widening("gemm_peak", "h100", ("megatron", "fsdp"), "rate", "Megatron-style and FSDP rows on H100"),
    Widening("wpass", "any", ("schedule",), "cost", "zero-bubble rows (W apart from B)", "schedule=zb"),
    Widening("cp_overlap", "any", ("cp",), "share", "context-parallel rows"),
    Widening("dp_overlap", "any", ("fsdp",), "share", "FSDP rows"),
    Widening("fp8_gemm_peak", "h100", ("fp8-bf16",), "rate", "BF16/FP8 pair ratios on H100 (FP8 over BF16)",
             "precision=fp8", residual="pair"),
)


def _profile_of(case: Case) -> str:
    if isinstance(case.row, vp.Row):
        return "a100"
    gpu = pr.cluster(case.row.cluster).gpu.name
    return "a100" if gpu.startswith("a100") else "h100" if gpu.startswith("h") else gpu


def _residuals(w: Widening, results: list[Result]) -> list[float]:
    """The residuals ``w`` reads (``Widening``): of its regimes' priced rows on its profile."""
    chosen = [r for r in results if r.error is not None and r.case.regime in w.regimes
              and (w.profile == "any" or _profile_of(r.case) == w.profile)]
    if w.residual == "pair":
        return pair_residuals(chosen, w.plan_has)
    return [r.error for r in chosen if r.error is not None and w.plan_has in getattr(r.case.row, "plan", "")]


def _multipliers(w: Widening, errors: list[float]) -> tuple[float, float]:
    if w.kind == "rate":
        return 1.0 + min(0.0, *errors), 1.0 + max(0.0, *errors)
    if w.kind == "cost":
        return 1.0 / (1.0 + max(0.0, *errors)), 1.0 / (1.0 + min(0.0, *errors))
    return 1.0 + min(0.0, *errors), 1.0


def oos_ranges(report: Report) -> dict[str, dict[str, dict[str, object]]]:
    """``{profile: {parameter: {low, high, source}}}``: each ``WIDENINGS`` entry's multiplier range
    over the out-of-sample residuals of its rows (the file ``autoplan.cost.params`` widens by)."""
    out: dict[str, dict[str, dict[str, object]]] = {}
    results = report.out_of_sample()
    for w in WIDENINGS:
        errors = _residuals(w, results)
        if not errors:
            continue
        low, high = _multipliers(w, errors)
        out.setdefault(w.profile, {})[w.parameter] = {
            "low": round(low, 3), "high": round(high, 3),
            "source": f"out-of-sample residuals of the {len(errors)} {w.rows} (validate_published.py --cv): "
                      f"{min(errors):+.1%} .. {max(errors):+.1%}"}
    return out


def ranges_yaml(report: Report) -> str:
    """The text of ``costmodels/uncertainty_cv.yaml``: ``ranges`` (``oos_ranges``) and ``regimes``
    (each regime's out-of-sample rows, mean and max |error|, as ``summary``)."""
    regimes = {k: {"rows": v["rows"], "mean_abs": round(v["mean_abs"], 4), "max_abs": round(v["max_abs"], 4)}
               for k, v in summary(report)["out_of_sample"].items() if v["rows"]}
    return ("# Out-of-sample error of the cost model, WRITTEN by `python experiments/validate_published.py\n"
            "# --cv --write` (cross_validation.ranges_yaml): each fitted parameter refitted without a row's\n"
            "# own source, that row priced.  `ranges`: the residuals read as multipliers on the parameter\n"
            "# their regime leans on, keyed by compute profile (`any`: every profile); autoplan/cost/params.py\n"
            "# widens (never narrows) the ranges of uncertainty.yaml / network.yaml / the profile by them, so\n"
            "# the bands sample what validation does not trust.  `regimes`: each regime's out-of-sample mean\n"
            "# and max |error| (the bench quotes them beside each margin).\n"
            + yaml.safe_dump({"ranges": oos_ranges(report), "regimes": regimes}, sort_keys=True, width=200))
