"""costmodels/profile_fit.py: fitting a ComputeProfile to measured times, and the profile YAML.

The sample is SYNTHETIC (tests/autoplan/calibrate/data/make_synthetic.py): the cost model's own
times for known H100-like parameters plus a deterministic +-3% wobble, so the fit must recover them.
"""
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import topologies
from costmodels.compute import load_profile, op_time
from costmodels.profile_fit import (
    AttentionSample,
    CopySample,
    GemmSample,
    TinySample,
    attention_fraction,
    copy_bandwidth,
    fit_gemm,
    fit_profile,
    gemm_model_seconds,
    measurements_from_mapping,
    measurements_to_mapping,
    profile_yaml,
)

DATA = os.path.join(os.path.dirname(__file__), "..", "autoplan", "calibrate", "data")
H100 = topologies.gpu_spec("h100")


def _generator():
    spec = importlib.util.spec_from_file_location("make_synthetic", os.path.join(DATA, "make_synthetic.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sample():
    with open(os.path.join(DATA, "synthetic_h100.yaml")) as f:
        data = yaml.safe_load(f)
    assert data["synthetic"] is True and "SYNTHETIC" in data["measurements"]["device"]
    return data["generating_parameters"], measurements_from_mapping(data["measurements"])


def _fit(measurements, **kw):
    return fit_profile(measurements, name="fit", peak_flops=H100.bf16_flops, hbm_bw=H100.hbm_bw,
                       fusion=0.5, **kw)


def _close(got, want, rel):
    return abs(got - want) <= rel * abs(want)


def test_fit_recovers_the_generating_parameters_from_the_noisy_sample(sample):
    gen, measurements = sample
    assert (len(measurements.gemm), len(measurements.attention)) == (845, 60)
    result = _fit(measurements)
    p = result.profile
    assert _close(p.gemm_peak_fraction, gen["gemm_peak_fraction"], 0.02)
    assert _close(p.gemm_half_dim, gen["gemm_half_dim"], 0.08)
    assert _close(p.attention_fwd_fraction, gen["attention_fwd_fraction"], 0.03)
    assert _close(p.attention_bwd_fraction, gen["attention_bwd_fraction"], 0.03)
    assert _close(p.memory_fraction, gen["memory_fraction"], 0.02)
    assert _close(p.overhead_s, gen["overhead_s"], 0.05)
    assert p.fusion == 0.5
    assert _close(result.attention_fractions["fwd full"], gen["attention_fwd_fraction_full_mask"], 0.03)
    assert _close(result.attention_fractions["bwd full"], gen["attention_bwd_fraction_full_mask"], 0.03)
    # +-3% uniform wobble has an RMS of 1.7% in log time: the fit explains everything else
    assert 0.012 < result.gemm_rms_log_error < 0.025


def test_fit_is_exact_without_noise():
    gen = _generator()
    result = _fit(gen.synthetic_measurements(wobble_size=0.0))
    p, g = result.profile, gen.GENERATING
    for field in ("gemm_peak_fraction", "gemm_half_dim", "attention_fwd_fraction",
                  "attention_bwd_fraction", "memory_fraction", "overhead_s"):
        assert _close(getattr(p, field), g[field], 2e-3), field
    assert result.gemm_rms_log_error < 1e-3


def test_full_mask_attention_can_set_the_profile(sample):
    gen, measurements = sample
    p = _fit(measurements, causal=False).profile
    assert _close(p.attention_fwd_fraction, gen["attention_fwd_fraction_full_mask"], 0.03)
    assert _close(p.attention_bwd_fraction, gen["attention_bwd_fraction_full_mask"], 0.03)


def test_vectorised_gemm_model_is_op_time():
    p = dataclasses.replace(load_profile("h100"), gemm_peak_fraction=0.7, gemm_half_dim=90.0)
    shapes = [(1024, 128, 128), (16384, 128, 16384), (4096, 4096, 4096), (16384, 12288, 1536)]
    m, n, k = (np.array(col, dtype=float) for col in zip(*shapes))
    vec = gemm_model_seconds(0.7, 90.0, m, n, k, peak_flops=H100.bf16_flops, hbm_bw=H100.hbm_bw,
                             memory_fraction=p.memory_fraction, overhead_s=p.overhead_s)
    for (mm, nn, kk), got in zip(shapes, vec):
        s = GemmSample(mm, nn, kk, 1.0)
        want = op_time("gemm", s.flops, s.nbytes, peak_flops=H100.bf16_flops, hbm_bw=H100.hbm_bw,
                       profile=p, gemm=(mm, nn, kk))
        assert math.isclose(got, want, rel_tol=1e-12)
    # the skinny one is memory bound: that is why the fit models the memory term
    skinny = GemmSample(16384, 128, 16384, 1.0)
    assert skinny.nbytes / (H100.hbm_bw * p.memory_fraction) > skinny.flops / (H100.bf16_flops * 0.7)


def test_gemm_fit_ignores_memory_bound_shapes():
    """Memory-bound GEMMs (made 10x slower than compute would be) leave the compute curve alone."""
    gen = _generator()
    clean = gen.synthetic_measurements(wobble_size=0.0).gemm
    mf, o = gen.GENERATING["memory_fraction"], gen.GENERATING["overhead_s"]
    slow_bw = H100.hbm_bw * mf / 10
    skewed = tuple(GemmSample(s.m, s.n, s.k, max(s.seconds, s.nbytes / slow_bw + o)) for s in clean)
    assert sum(a.seconds != b.seconds for a, b in zip(clean, skewed)) > 100
    p, h, rms = fit_gemm(skewed, peak_flops=H100.bf16_flops, hbm_bw=H100.hbm_bw,
                         memory_fraction=mf / 10, overhead_s=o)
    assert _close(p, 0.78, 2e-3) and _close(h, 110.0, 2e-3) and rms < 1e-3


def test_attention_fraction_is_a_median_over_long_sequences():
    def s(seq, seconds, causal=True):
        return AttentionSample("fwd", 1, 16, seq, 128, causal, seconds)

    base = s(8192, 1.0).flops / (H100.bf16_flops * 0.6)
    samples = (s(2048, 1.0), s(4096, base / 4), s(8192, base), s(16384, base * 4), s(16384, base * 40),
               s(8192, base / 2, causal=False))
    frac = attention_fraction(samples, "fwd", True, peak_flops=H100.bf16_flops, overhead_s=0.0)
    assert math.isclose(frac, 0.6)       # the short seq and the 10x outlier do not move the median
    assert attention_fraction(samples, "bwd", True, peak_flops=H100.bf16_flops, overhead_s=0.0) is None


def test_copy_bandwidth_uses_only_copies_beyond_cache():
    gib = 2**30
    copies = (CopySample(16 * 2**20, 2 * 16 * 2**20 / 9e12),      # L2-resident: 9 TB/s
              CopySample(gib, 2 * gib / 3e12), CopySample(2 * gib, 2 * 2 * gib / 3e12))
    assert math.isclose(copy_bandwidth(copies, 0.0), 3e12)


def test_missing_kinds_are_value_errors(sample):
    _, m = sample
    with pytest.raises(ValueError, match="no tiny kernels"):
        _fit(dataclasses.replace(m, tiny=()))
    with pytest.raises(ValueError, match="no copies"):
        _fit(dataclasses.replace(m, copy=()))
    with pytest.raises(ValueError, match="no causal-mask attention fwd"):
        _fit(dataclasses.replace(m, attention=tuple(a for a in m.attention if not a.causal)))
    with pytest.raises(ValueError, match="need at least 3"):
        _fit(dataclasses.replace(m, gemm=m.gemm[:2]))


def test_profile_yaml_round_trips_through_load_profile(sample, tmp_path):
    _, measurements = sample
    result = _fit(measurements)
    text = profile_yaml(result.profile, "h100", measurements, comment="line one\n\nline three")
    assert text.startswith("# line one\n#\n# line three\nname: fit\ngpu: h100\n")
    path = tmp_path / "fit.yaml"
    path.write_text(text)
    assert load_profile("h100", str(path)) == result.profile
    back = measurements_from_mapping(yaml.safe_load(text)["measurements"])
    assert back == measurements           # the sample already holds 4 significant digits


def test_fit_and_yaml_are_deterministic(sample):
    _, measurements = sample
    a, b = _fit(measurements), _fit(measurements)
    assert a == b
    assert profile_yaml(a.profile, "h100", measurements) == profile_yaml(b.profile, "h100", measurements)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("timing"), "lacks timing"),
    (lambda d: d.update(dtype="fp16"), "only bf16"),
    (lambda d: d["gemm"].update(columns=["m", "n", "seconds"]), "must have columns"),
    (lambda d: d["gemm"]["rows"].append([1024, 1024, 0.5]), "expected 4 values"),
    (lambda d: d["gemm"]["rows"].append([1024, 1024, 1024, -1.0]), "seconds must be a positive number"),
    (lambda d: d["gemm"]["rows"].append([1024, "1k", 1024, 1.0]), "n must be a positive integer"),
    (lambda d: d["attention"]["rows"].append(["up", 1, 8, 2048, 128, True, 1.0]), "direction must be fwd or bwd"),
    (lambda d: d["attention"]["rows"].append(["fwd", 1, 8, 2048, 128, "yes", 1.0]), "causal must be true or false"),
])
def test_malformed_measurements_name_the_problem(sample, edit, message):
    _, measurements = sample
    data = measurements_to_mapping(measurements)
    edit(data)
    with pytest.raises(ValueError, match=message):
        measurements_from_mapping(data)


def test_tiny_sample_table_round_trip():
    data = {"device": "d", "software": "s", "attention_kernel": "flash", "timing": "t", "dtype": "bf16",
            "gemm": {"columns": ["m", "n", "k", "seconds"], "rows": []},
            "attention": {"columns": ["direction", "batch", "heads", "seq", "head_dim", "causal", "seconds"],
                          "rows": [["bwd", 2, 8, 4096, 128, False, 0.0125]]},
            "copy": {"columns": ["nbytes", "seconds"], "rows": [[1024, 1e-6]]},
            "tiny": {"columns": ["kernel", "seconds"], "rows": [["add_1k", 4e-6]]}}
    m = measurements_from_mapping(data)
    assert m.attention == (AttentionSample("bwd", 2, 8, 4096, 128, False, 0.0125),)
    assert m.tiny == (TinySample("add_1k", 4e-6),) and m.copy == (CopySample(1024, 1e-6),)
    assert measurements_to_mapping(m) == data


def test_profile_fit_does_not_import_torch():
    code = ("import sys, costmodels.profile_fit; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'autoplan')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
