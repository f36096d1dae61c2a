"""Fit a ``ComputeProfile`` to measured kernel times: the fitting half of ``autoplan calibrate``.

Pure Python + numpy (no torch).  The measuring half (``autoplan/calibrate``) times kernels on
one GPU and hands the times over as ``Measurements``; this module turns them into the profile
parameters of ``costmodels.compute`` and reads/writes the profile YAML.

Every parameter is fitted so that ``costmodels.compute.op_time`` -- the formula the planner
uses -- reproduces the measured seconds (``peak`` = catalog BF16 FLOP/s, ``hbm_bw`` = catalog
HBM bytes/s, ``o`` = ``overhead_s``):

* ``overhead_s``: median seconds per call of tiny kernels launched back to back (a 1k-element
  add, a 4 KiB copy, a 64x64x64 GEMM).  Their FLOPs and bytes are negligible, so what remains
  is the per-kernel launch + tail.
* ``memory_fraction``: median over large copies (>= 256 MiB, far beyond any L2) of the achieved
  bandwidth ``2·bytes / (t - o)`` (a copy reads and writes every byte), divided by ``hbm_bw``.
* ``attention_fwd_fraction`` / ``attention_bwd_fraction``: median over large shapes
  (seq >= 4096) of ``FLOPs / (peak · (t - o))``.  FLOPs are counted as the cost model counts
  them (``autoplan/frontend/costs.py``: full s², no discount for a causal mask):
  forward ``4·b·a·s²·d``, backward ``10·b·a·s²·d`` (the recomputed QKᵀ plus four GEMMs).
  The profile takes the *causal* kernels by default, as the zoo's models run them; a causal
  kernel skips half the score matrix, so its fraction reads about twice a full-mask one.
* ``gemm_peak_fraction`` (``p``) and ``gemm_half_dim`` (``h``): least squares in log time of
  ``t(M, N, K) = max(2·M·N·K / (peak·p·Π_d d/(d + h)), bytes / (hbm_bw·memory_fraction)) + o``
  with ``bytes = 2·(M·K + K·N + M·N)`` (bf16 operands and result).  Fitting the cost model's
  own time formula, memory term included, keeps skinny memory-bound GEMMs and launch-bound
  tiny ones from being folded into the efficiency curve.  Search: a grid over
  ``(p, log h)``, then a pattern search (halving steps) from the best grid point; deterministic.
* ``fusion`` (how much elementwise traffic a training stack fuses away) is a property of the
  software stack, not the GPU; it is passed in (``autoplan calibrate`` keeps the shipped
  profile's value).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import yaml

from costmodels.compute import ComputeProfile

BYTES_PER_ELEMENT = 2            # bf16: every measurement is taken in bf16
LARGE_COPY_BYTES = 256 * 2**20   # copies at least this large stream from HBM, not L2
LARGE_ATTENTION_SEQ = 4096       # attention shapes at least this long set the fractions


@dataclass(frozen=True)
class GemmSample:
    """One timed ``[M, K] @ [K, N]`` bf16 GEMM: seconds per call."""

    m: int
    n: int
    k: int
    seconds: float

    @property
    def flops(self) -> float:
        """2·M·N·K (multiply-add = 2)."""
        return 2.0 * self.m * self.n * self.k

    @property
    def nbytes(self) -> float:
        """HBM bytes read and written: both operands and the result, bf16."""
        return float(BYTES_PER_ELEMENT * (self.m * self.k + self.k * self.n + self.m * self.n))


@dataclass(frozen=True)
class AttentionSample:
    """One timed SDPA kernel on ``[batch, heads, seq, head_dim]`` bf16 q, k, v: seconds per call."""

    direction: str     # "fwd" or "bwd"
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    seconds: float

    @property
    def flops(self) -> float:
        """FLOPs as the cost model counts them: full s², fwd 4·b·a·s²·d, bwd 2.5x that."""
        fwd = 4.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim
        return fwd if self.direction == "fwd" else 2.5 * fwd


@dataclass(frozen=True)
class CopySample:
    """One timed device-to-device copy of ``nbytes`` bytes: seconds per call."""

    nbytes: int
    seconds: float


@dataclass(frozen=True)
class TinySample:
    """One tiny kernel (named, e.g. ``"add_1k"``) launched back to back: seconds per call."""

    kernel: str
    seconds: float


@dataclass(frozen=True)
class Measurements:
    """Everything ``autoplan calibrate`` timed on one GPU (all bf16, seconds per call)."""

    device: str              # e.g. torch.cuda.get_device_name(): "NVIDIA H100 80GB HBM3"
    software: str            # e.g. "torch 2.13.0, CUDA 12.8"
    attention_kernel: str    # the SDPA backend timed: "flash" or "efficient"
    timing: str              # how a time was taken (events, warm-up, repeats)
    gemm: tuple[GemmSample, ...]
    attention: tuple[AttentionSample, ...]
    copy: tuple[CopySample, ...]
    tiny: tuple[TinySample, ...]


@dataclass(frozen=True)
class FitResult:
    """A fitted profile plus how well it explains the measurements."""

    profile: ComputeProfile
    gemm_samples: int
    gemm_rms_log_error: float          # RMS of ln(model / measured) over the GEMMs
    attention_fractions: dict[str, float]  # "fwd causal", "bwd full", ...: every mask measured
    copy_bandwidth: float              # bytes/s, median over the large copies

    def summary(self) -> dict[str, Any]:
        """Plain-JSON view: the profile's fields and the fit statistics."""
        return {"profile": asdict(self.profile), "gemm_samples": self.gemm_samples,
                "gemm_rms_log_error": round(self.gemm_rms_log_error, 4),
                "attention_fractions": dict(sorted(self.attention_fractions.items())),
                "copy_bandwidth_gbyte_s": round(self.copy_bandwidth / 1e9, 1)}


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------

def fit_overhead(tiny: tuple[TinySample, ...]) -> float:
    """``overhead_s``: median seconds per call of the tiny kernels."""
    if not tiny:
        raise ValueError("measurements have no tiny kernels: cannot fit overhead_s")
    return statistics.median(s.seconds for s in tiny)


def copy_bandwidth(copies: tuple[CopySample, ...], overhead_s: float) -> float:
    """Median achieved bandwidth ``2·bytes / (t - overhead)`` over the large copies, bytes/s.

    Copies of at least ``LARGE_COPY_BYTES`` count; if none is that large, all do.
    """
    if not copies:
        raise ValueError("measurements have no copies: cannot fit memory_fraction")
    large = [c for c in copies if c.nbytes >= LARGE_COPY_BYTES] or list(copies)
    return statistics.median(2.0 * c.nbytes / _net_seconds(c.seconds, overhead_s) for c in large)


def attention_fraction(samples: tuple[AttentionSample, ...], direction: str, causal: bool, *,
                       peak_flops: float, overhead_s: float) -> float | None:
    """Median ``FLOPs / (peak · (t - overhead))`` over the large shapes of one kind; None if unmeasured.

    Shapes with seq >= ``LARGE_ATTENTION_SEQ`` count; if none is that long, all do.
    """
    chosen = [s for s in samples if s.direction == direction and s.causal == causal]
    if not chosen:
        return None
    large = [s for s in chosen if s.seq >= LARGE_ATTENTION_SEQ] or chosen
    return statistics.median(s.flops / (peak_flops * _net_seconds(s.seconds, overhead_s))
                             for s in large)


def gemm_model_seconds(p: float, half_dim: float, m: np.ndarray, n: np.ndarray, k: np.ndarray, *,
                       peak_flops: float, hbm_bw: float, memory_fraction: float,
                       overhead_s: float) -> np.ndarray:
    """``costmodels.compute.op_time`` for GEMMs, vectorised over shapes (seconds)."""
    eff = p * (m / (m + half_dim)) * (n / (n + half_dim)) * (k / (k + half_dim))
    t_compute = 2.0 * m * n * k / (peak_flops * eff)
    t_memory = BYTES_PER_ELEMENT * (m * k + k * n + m * n) / (hbm_bw * memory_fraction)
    seconds: np.ndarray = np.maximum(t_compute, t_memory) + overhead_s   # numpy types np.maximum as Any
    return seconds


def fit_gemm(samples: tuple[GemmSample, ...], *, peak_flops: float, hbm_bw: float,
             memory_fraction: float, overhead_s: float) -> tuple[float, float, float]:
    """Least squares in log time for ``(gemm_peak_fraction, gemm_half_dim)``.

    Returns ``(p, h, rms)``, ``rms`` = RMS of ln(model / measured).  ``p`` is searched in
    [0.01, 1], ``h`` in [1, 65536] (log scale): a 96 x 65 grid, then a pattern search that
    halves its steps until they are below 1e-7.
    """
    if len(samples) < 3:
        raise ValueError(f"measurements have {len(samples)} GEMMs: "
                         "need at least 3 to fit the GEMM curve")
    m = np.array([s.m for s in samples], dtype=float)
    n = np.array([s.n for s in samples], dtype=float)
    k = np.array([s.k for s in samples], dtype=float)
    log_t = np.log(np.array([s.seconds for s in samples], dtype=float))
    env = dict(peak_flops=peak_flops, hbm_bw=hbm_bw, memory_fraction=memory_fraction,
               overhead_s=overhead_s)
    p_lo, p_hi, lh_lo, lh_hi = 0.01, 1.0, 0.0, math.log(65536.0)

    def loss(p: float, log_h: float) -> float:
        t = gemm_model_seconds(p, math.exp(log_h), m, n, k, **env)
        return float(np.mean((np.log(t) - log_t) ** 2))

    p_grid = np.linspace(p_lo, p_hi, 96)
    lh_grid = np.linspace(lh_lo, lh_hi, 65)
    best = min((loss(float(p), float(lh)), float(p), float(lh)) for p in p_grid for lh in lh_grid)
    err, p, lh = best
    step_p, step_lh = float(p_grid[1] - p_grid[0]), float(lh_grid[1] - lh_grid[0])
    while step_p > 1e-7 or step_lh > 1e-7:
        moved = False
        for dp, dlh in ((step_p, 0.0), (-step_p, 0.0), (0.0, step_lh), (0.0, -step_lh)):
            cand_p = min(p_hi, max(p_lo, p + dp))
            cand_lh = min(lh_hi, max(lh_lo, lh + dlh))
            cand = loss(cand_p, cand_lh)
            if cand < err:
                err, p, lh, moved = cand, cand_p, cand_lh, True
        if not moved:
            step_p, step_lh = step_p / 2, step_lh / 2
    return p, math.exp(lh), math.sqrt(err)


def fit_profile(measurements: Measurements, *, name: str, peak_flops: float, hbm_bw: float,
                fusion: float, source: str = "", causal: bool = True) -> FitResult:
    """Fit every ``ComputeProfile`` parameter (see the module docstring); ``fusion`` is passed through.

    ``peak_flops`` / ``hbm_bw`` are the catalog BF16 FLOP/s and HBM bytes/s of the GPU kind;
    ``causal`` picks which attention masks set the attention fractions.  Fitted numbers are
    rounded to 4 significant digits (what the YAML holds).
    """
    m = measurements
    overhead = fit_overhead(m.tiny)
    bandwidth = copy_bandwidth(m.copy, overhead)
    memory_fraction = _round4(bandwidth / hbm_bw)
    mask = "causal" if causal else "full"
    fractions = {}
    for direction in ("fwd", "bwd"):
        for is_causal in (True, False):
            frac = attention_fraction(m.attention, direction, is_causal, peak_flops=peak_flops,
                                      overhead_s=overhead)
            if frac is not None:
                fractions[f"{direction} {'causal' if is_causal else 'full'}"] = _round4(frac)
    for direction in ("fwd", "bwd"):
        if f"{direction} {mask}" not in fractions:
            raise ValueError(f"measurements have no {mask}-mask attention {direction} kernels")
    p, half_dim, rms = fit_gemm(m.gemm, peak_flops=peak_flops, hbm_bw=hbm_bw,
                                memory_fraction=memory_fraction, overhead_s=_round4(overhead))
    profile = ComputeProfile(
        name=name, gemm_peak_fraction=_round4(p), gemm_half_dim=_round4(half_dim),
        attention_fwd_fraction=fractions[f"fwd {mask}"],
        attention_bwd_fraction=fractions[f"bwd {mask}"],
        memory_fraction=memory_fraction, fusion=fusion, overhead_s=_round4(overhead),
        source=source)
    return FitResult(profile=profile, gemm_samples=len(m.gemm), gemm_rms_log_error=rms,
                     attention_fractions=fractions, copy_bandwidth=bandwidth)


def _net_seconds(seconds: float, overhead_s: float) -> float:
    """Kernel seconds less the per-kernel overhead (op_time adds it back); never below half."""
    return max(seconds - overhead_s, 0.5 * seconds)


def _round4(x: float) -> float:
    """``x`` to 4 significant digits."""
    return float(f"{x:.4g}")


# ---------------------------------------------------------------------------------------------
# YAML: measurements as tables (columns + rows), profiles as fitted fields + measurements
# ---------------------------------------------------------------------------------------------

_TABLES = {
    "gemm": (GemmSample, ("m", "n", "k", "seconds")),
    "attention": (AttentionSample,
                  ("direction", "batch", "heads", "seq", "head_dim", "causal", "seconds")),
    "copy": (CopySample, ("nbytes", "seconds")),
    "tiny": (TinySample, ("kernel", "seconds")),
}
_HEADER = ("device", "software", "attention_kernel", "timing")
_Check = tuple[Callable[[Any], bool], str]
_POSITIVE_INT: _Check = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer")
_COLUMN_CHECKS: dict[str, _Check] = {   # (predicate, what it wants); any other column: _POSITIVE_INT
    "seconds": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
                "a positive number"),
    "causal": (lambda v: isinstance(v, bool), "true or false"),
    "direction": (lambda v: v in ("fwd", "bwd"), "fwd or bwd"),
    "kernel": (lambda v: isinstance(v, str), "a string"),
}


def measurements_to_mapping(m: Measurements) -> dict[str, Any]:
    """YAML-ready mapping: the header strings, ``dtype: bf16``, then one table per kind.

    A table is ``{columns: [...], rows: [[...], ...]}``; seconds keep 4 significant digits.
    """
    out: dict[str, Any] = {key: getattr(m, key) for key in _HEADER}
    out["dtype"] = "bf16"
    for key, (_cls, columns) in _TABLES.items():
        rows = [[_round4(getattr(s, c)) if c == "seconds" else getattr(s, c) for c in columns]
                for s in getattr(m, key)]
        out[key] = {"columns": list(columns), "rows": rows}
    return out


def measurements_from_mapping(data: Any) -> Measurements:
    """Inverse of ``measurements_to_mapping``; ``ValueError`` naming the first thing wrong."""
    if not isinstance(data, dict):
        raise ValueError("'measurements' must be a mapping")
    missing = [key for key in (*_HEADER, "dtype", *_TABLES) if key not in data]
    if missing:
        raise ValueError(f"'measurements' lacks {', '.join(missing)}")
    if data["dtype"] != "bf16":
        raise ValueError(f"'measurements' dtype is {data['dtype']!r}; only bf16 is supported")
    values: dict[str, Any] = {key: str(data[key]) for key in _HEADER}   # then one tuple per table
    for key, (cls, columns) in _TABLES.items():
        table = data[key]
        if not isinstance(table, dict) or list(table.get("columns") or ()) != list(columns):
            raise ValueError(f"'measurements.{key}' must have columns {list(columns)}")
        values[key] = tuple(_sample(cls, key, columns, i, row)
                            for i, row in enumerate(table.get("rows") or ()))
    return Measurements(**values)


def _sample(cls: type, table: str, columns: tuple[str, ...], i: int, row: Any) -> Any:
    """One table row as a sample, its values checked against ``_COLUMN_CHECKS``."""
    where = f"'measurements.{table}' row {i}"
    if not isinstance(row, list) or len(row) != len(columns):
        raise ValueError(f"{where}: expected {len(columns)} values {list(columns)}, got {row!r}")
    for column, value in zip(columns, row):
        ok, need = _COLUMN_CHECKS.get(column, _POSITIVE_INT)
        if not ok(value):
            raise ValueError(f"{where}: {column} must be {need}, not {value!r}")
    return cls(**dict(zip(columns, row)))


def profile_yaml(profile: ComputeProfile, gpu: str, measurements: Measurements,
                 comment: str = "") -> str:
    """Profile YAML ``load_profile`` reads: the fitted fields, ``gpu`` and ``measurements``.

    ``comment`` lines go on top as ``#`` comments.  Key order is fixed (same input, same bytes).
    """
    data: dict[str, Any] = {"name": profile.name, "gpu": gpu, "source": profile.source}
    data.update({f.name: getattr(profile, f.name) for f in fields(ComputeProfile)
                 if f.name not in ("name", "source")})
    data["measurements"] = measurements_to_mapping(measurements)
    head = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    body: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)   # Any untyped
    return head + body
