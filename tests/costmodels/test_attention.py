"""costmodels/attention.py: a named flash-attention kernel priced at its published H100 throughput."""
import pytest

from costmodels.attention import ATTENTION_KERNELS, PUBLISHED, kernel_fractions, with_kernel
from costmodels.compute import load_profile, op_time


def test_fractions_are_the_fa3_papers_tflops_over_the_h100s_989():
    # FA3 paper, H100 SXM5, head dim 128, 16K: FA2 335 forward (causal) / 322 backward, cuDNN 539 / 516
    assert kernel_fractions("fa2", "h100") == pytest.approx((335 / 989, 322 / 989))
    assert kernel_fractions("cudnn", "h100") == pytest.approx((0.54499, 0.52174), abs=1e-5)
    assert kernel_fractions("fa3", "H100") == pytest.approx((616 / 989, 561 / 989))


def test_the_h100s_sm_shares_its_numbers_and_profile_keeps_the_fit():
    assert kernel_fractions("fa2", "h200") == kernel_fractions("fa2", "h800") == kernel_fractions("fa2", "h100")
    assert kernel_fractions("profile", "a100") is None
    fitted = load_profile("h100")
    assert with_kernel(fitted, "profile", "h100") is fitted


def test_a_kernel_without_published_numbers_on_the_gpu_is_refused():
    with pytest.raises(ValueError, match="no published throughput of attention kernel 'fa3' on 'a100'"):
        kernel_fractions("fa3", "a100")


def test_every_named_kernel_has_h100_numbers():
    assert {k for k, g in PUBLISHED if g == "h100"} == set(ATTENTION_KERNELS) - {"profile"}


def test_an_attention_op_runs_at_the_kernels_flops_on_the_gpus_own_peak():
    """1e12 FLOPs of forward attention under FA2 on a full-power H100 take 1e12 / 335e12 s (plus the
    profile's per-kernel overhead); on a 500 W H100 (peak 989 * 500/700 = 706.4 TFLOP/s) the same
    share of its capped peak: 1e12 / (335e12 * 500/700)."""
    prof = with_kernel(load_profile("h100"), "fa2", "h100")
    args = dict(flops=1e12, nbytes=0.0, hbm_bw=3.35e12, profile=prof)
    assert op_time("attention_fwd", peak_flops=989e12, **args) == pytest.approx(1 / 335 + prof.overhead_s)
    assert op_time("attention_bwd", peak_flops=989e12, **args) == pytest.approx(1 / 322 + prof.overhead_s)
    capped = 989e12 * 500 / 700
    assert op_time("attention_fwd", peak_flops=capped, **args) == pytest.approx(1 / (335 * 500 / 700) + prof.overhead_s)
