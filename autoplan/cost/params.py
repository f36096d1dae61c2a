"""The cost model's uncertain physical parameters, as multipliers on their point values.

``Params`` holds one multiplier per parameter (1.0 everywhere: the point estimate).  The
hardware ones act on the data the model reads — the compute profile (``gemm_peak`` on
``gemm_peak_fraction`` and the FP8 fraction, ``fp8_gemm_peak`` on the FP8 fraction alone —
``fp8_gemm_peak_fraction``, fitted apart from the BF16 one, so FP8 efficiency relative to BF16
varies on its own — ``gemm_half_dim``, ``attention`` on both flash-attention fractions,
``memory_bw`` on ``memory_fraction``, ``host_floor`` on ``host_floor_s``) and the cluster's
link efficiencies (``nic_efficiency``, ``nvlink_efficiency`` on the ring and NVLS fractions);
efficiencies are capped at 1.  The mechanism ones act where the cost model uses them:
``dp_overlap`` and ``cp_overlap`` scale the compute window DP traffic and ring-CP hops hide
behind (``dp.dp_exposed``, ``cp.cp_cost``), ``wpass`` the weight-gradient pass of schedules
that split it from B (``pp.price_pipeline``), ``recompute`` the recomputed forward (``parts``).

Their ranges (``Range``: low, high, source) are data: the priors of
``costmodels/uncertainty.yaml``, narrowed where runs of a regime measured them by the
``uncertainty:`` key of ``topologies/network.yaml`` and then of the GPU's compute profile, then
widened (never narrowed) to the out-of-sample spread of ``costmodels/uncertainty_cv.yaml``
(written by ``experiments/validate_published.py --cv --write``: leave-one-source-out residuals of
the public rows, keyed by compute profile), so a band samples what the validation does not trust.
Last, each range is centred on the point value (``_centred``: [1 − d, 1 + d], d its larger
side): the point is the model's best estimate, so an error is as likely either way; a one-sided
range (W passes only ever slower) would make the robust ranking hedge against one direction
only and lose where the error runs the other way (issue 38's scenarios: a split W pass 20 %
cheaper than priced).
A new parameter is appended last: ``uncertainty.draw`` fills the columns in field order from one
seeded generator, so the earlier parameters keep their samples (a plan that never reads the new
parameter keeps its band byte for byte).
A perturbation file (YAML ``{name: multiplier}``, ``load_override``) fixes some of them.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any

from autoplan.errors import UserError
from costmodels.compute import PROFILE_DIR, ComputeProfile
from costmodels.memo import memo
from topologies._data import read_yaml
from topologies.cluster import Cluster
from topologies.strict_load import load_yaml

PRIORS_PATH = os.path.join(os.path.dirname(PROFILE_DIR), "uncertainty.yaml")
OUT_OF_SAMPLE_PATH = os.path.join(os.path.dirname(PROFILE_DIR), "uncertainty_cv.yaml")


@dataclass(frozen=True)
class Params:
    """Multipliers on the point values of the uncertain parameters (module docstring)."""

    gemm_peak: float = 1.0
    gemm_half_dim: float = 1.0
    attention: float = 1.0
    memory_bw: float = 1.0
    host_floor: float = 1.0
    nic_efficiency: float = 1.0
    nvlink_efficiency: float = 1.0
    dp_overlap: float = 1.0
    cp_overlap: float = 1.0
    wpass: float = 1.0
    recompute: float = 1.0
    fp8_gemm_peak: float = 1.0       # last: see the module docstring

    @property
    def nominal(self) -> bool:
        return self == NOMINAL


NOMINAL = Params()
PARAM_NAMES = tuple(f.name for f in fields(Params))


@dataclass(frozen=True)
class Range:
    """Where one parameter's multiplier may lie, and what says so."""

    name: str
    low: float
    high: float
    source: str


def perturb_profile(profile: ComputeProfile, p: Params) -> ComputeProfile:
    """The compute profile under ``p`` (fractions capped at 1).  The FP8 fraction is the one FP8
    GEMMs price with (the profile's own, else the BF16 fraction it falls back to) ×
    ``gemm_peak`` × ``fp8_gemm_peak``."""
    if p.nominal:
        return profile
    fp8 = profile.fp8_gemm_peak_fraction or profile.gemm_peak_fraction
    return dataclasses.replace(
        profile, gemm_peak_fraction=min(1.0, profile.gemm_peak_fraction * p.gemm_peak),
        fp8_gemm_peak_fraction=min(1.0, fp8 * p.gemm_peak * p.fp8_gemm_peak),
        gemm_half_dim=profile.gemm_half_dim * p.gemm_half_dim,
        attention_fwd_fraction=min(1.0, profile.attention_fwd_fraction * p.attention),
        attention_bwd_fraction=min(1.0, profile.attention_bwd_fraction * p.attention),
        memory_fraction=min(1.0, profile.memory_fraction * p.memory_bw),
        host_floor_s=profile.host_floor_s * p.host_floor, moe_host_floor_s=profile.moe_host_floor_s * p.host_floor,
        moe_sync_s=profile.moe_sync_s * p.host_floor, moe_p2p_host_s=profile.moe_p2p_host_s * p.host_floor)


def perturb_cluster(cluster: Cluster, p: Params) -> Cluster:
    """The cluster's link efficiencies under ``p`` (capped at 1)."""
    if p.nic_efficiency == 1.0 and p.nvlink_efficiency == 1.0:
        return cluster
    return dataclasses.replace(
        cluster, nic_efficiency=min(1.0, cluster.nic_efficiency * p.nic_efficiency),
        nvlink_efficiency=min(1.0, cluster.nvlink_efficiency * p.nvlink_efficiency),
        nvls_efficiency=min(1.0, cluster.nvls_efficiency * p.nvlink_efficiency))


def ranges(gpu: str, profile_path: str | None = None) -> tuple[Range, ...]:
    """Every parameter's range: priors, then network.yaml's, then the compute profile's."""
    path = profile_path or _default_profile_path(gpu)
    return _ranges(os.path.abspath(path) if path else "")


@memo(64)
def _ranges(profile_path: str) -> tuple[Range, ...]:
    merged = dict(_read(PRIORS_PATH, yaml_data=None))
    merged.update(_read("topologies/network.yaml", yaml_data=read_yaml("network.yaml").get("uncertainty", {})))
    if profile_path and os.path.exists(profile_path):
        with open(profile_path) as f:
            merged.update(_read(profile_path, yaml_data=(load_yaml(f.read()) or {}).get("uncertainty", {})))
    profile = os.path.basename(profile_path)[:-len(".yaml")] if profile_path else ""
    for name, wide in _out_of_sample(profile).items():
        if name in merged:
            merged[name] = _widen(merged[name], wide)
    missing = [n for n in PARAM_NAMES if n not in merged]
    if missing:
        raise ValueError(f"{PRIORS_PATH}: no range for {missing}")
    return tuple(_centred(merged[n]) for n in PARAM_NAMES)


def _out_of_sample(profile: str) -> dict[str, Range]:
    """The out-of-sample ranges for ``profile`` (its own entries over the ``any`` ones)."""
    if not os.path.exists(OUT_OF_SAMPLE_PATH):
        return {}
    with open(OUT_OF_SAMPLE_PATH) as f:
        data = (load_yaml(f.read()) or {}).get("ranges", {})
    out = _read(OUT_OF_SAMPLE_PATH, yaml_data=data.get("any", {}))
    out.update(_read(OUT_OF_SAMPLE_PATH, yaml_data=data.get(profile, {})) if profile else {})
    return out


def out_of_sample_errors() -> dict[str, float]:
    """Each validated regime's out-of-sample mean |error| (``uncertainty_cv.yaml``'s ``regimes``:
    megatron, fsdp, single-node, schedule, cp, moe, fp8-bf16); empty without the file."""
    if not os.path.exists(OUT_OF_SAMPLE_PATH):
        return {}
    with open(OUT_OF_SAMPLE_PATH) as f:
        regimes = (load_yaml(f.read()) or {}).get("regimes", {})
    return {name: float(v["mean_abs"]) for name, v in regimes.items()}


def _widen(r: Range, wide: Range) -> Range:
    """``r`` stretched to cover ``wide`` (unchanged where it already does)."""
    if wide.low >= r.low and wide.high <= r.high:
        return r
    return Range(r.name, min(r.low, wide.low), max(r.high, wide.high), f"{r.source}; widened by the {wide.source}")


SHARES = ("dp_overlap", "cp_overlap")
"""Parameters that are shares of a window (1 = all of it): centred, they stay ≤ 1."""


def _centred(r: Range) -> Range:
    """``r`` made symmetric about the point value 1: [1 − d, 1 + d], d = its larger side (a
    share's top stays at 1)."""
    d = round(max(1.0 - r.low, r.high - 1.0), 6)
    high = 1.0 if r.name in SHARES else 1.0 + d
    if r.low == 1.0 - d and r.high == high:
        return r
    return Range(r.name, 1.0 - d, high, f"{r.source}; centred on the point value (±{d:.1%})")


def _read(where: str, yaml_data: dict[str, Any] | None) -> dict[str, Range]:
    if yaml_data is None:
        with open(where) as f:
            yaml_data = load_yaml(f.read())
    out = {}
    for name, spec in yaml_data.items():
        if name not in PARAM_NAMES:
            raise ValueError(f"{where}: unknown uncertain parameter '{name}' (known: {', '.join(PARAM_NAMES)})")
        low, high = float(spec["low"]), float(spec["high"])
        if not low <= 1.0 <= high:
            raise ValueError(f"{where}: the range of {name}, [{low}, {high}], must contain the point value 1.0")
        out[name] = Range(name, low, high, str(spec.get("source", "")))
    return out


def _default_profile_path(gpu: str) -> str | None:
    from costmodels.compute import _PROFILE_ALIASES
    base = gpu.lower()
    path = os.path.join(PROFILE_DIR, f"{_PROFILE_ALIASES.get(base, base)}.yaml")
    return path if os.path.exists(path) else None


def load_override(path: str) -> Params:
    """A perturbation file: YAML ``{parameter: multiplier}`` (unnamed parameters stay at 1)."""
    try:
        with open(path) as f:
            data = load_yaml(f.read()) or {}
    except OSError as e:
        raise UserError(f"cannot read the parameter override {path}: {e.strerror}",
                        "pass --params PATH to a YAML file of {parameter: multiplier}") from None
    bad = sorted(set(data) - set(PARAM_NAMES)) if isinstance(data, dict) else ["(not a mapping)"]
    if bad:
        raise UserError(f"{path}: unknown parameters {bad}", f"use some of: {', '.join(PARAM_NAMES)}")
    try:
        return Params(**{k: float(v) for k, v in data.items()})
    except (TypeError, ValueError):
        raise UserError(f"{path}: every multiplier must be a number", "write e.g. `nic_efficiency: 0.8`") from None
