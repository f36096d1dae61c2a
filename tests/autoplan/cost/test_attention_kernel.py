"""EstimateOptions.attention_kernel: the cost model prices attention at the named kernel's
published throughput (costmodels.attention), and refuses a GPU without one."""
import pytest

import topologies
from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.params import Params
from autoplan.cost.prices import Prices
from autoplan.errors import UserError
from autoplan.frontend import trace
from autoplan.plan import Plan


def test_prices_replace_the_profiles_attention_fractions_then_scale_them():
    h100 = topologies.load("h100x8")
    fitted = Prices(h100)
    fa2 = Prices(h100, attention_kernel="fa2")
    assert (fitted.profile.attention_fwd_fraction, fitted.profile.attention_bwd_fraction) == (0.3, 0.245)
    assert fa2.profile.attention_fwd_fraction == pytest.approx(335 / 989)
    assert fa2.op_seconds("attention_bwd", 322e12, 0.0, None) == pytest.approx(1.0 + fa2.profile.overhead_s)
    assert fa2.profile.gemm_peak_fraction == fitted.profile.gemm_peak_fraction    # only attention moves
    slow = Prices(h100, params=Params(attention=0.8), attention_kernel="fa2")      # the band acts on the kernel
    assert slow.profile.attention_fwd_fraction == pytest.approx(0.8 * 335 / 989)


def test_an_attention_bound_step_is_faster_by_the_kernels_ratio():
    """A 1-layer model at 32K, one micro-batch per GPU: the step saves exactly the attention
    kernels' time difference.  Forward work W = 4·s²·h/2 · (1 + 128/s) (causal, with the diagonal
    tiles) = 2.2076e12 FLOPs, backward 2.5 W; fitted 0.3 / 0.245 of 989 TFLOP/s against FA2's
    335 / 322: W·(1/296.7 − 1/335) + 2.5·W·(1/242.3 − 1/322) = 0.851 + 5.637 = 6.488 ms."""
    model = trace("llama:layers=1,hidden=1024,heads=8,kv_heads=8,ffn=2048,vocab=1024", seq=32768)
    plan = Plan.parse("tp=1,pp=1,dp=8,mbs=1,recompute=none", num_gpus=8)
    h100 = topologies.load("h100x8")
    base = Estimator(model, h100).estimate(plan, 8)
    fa2 = Estimator(model, h100, EstimateOptions(attention_kernel="fa2")).estimate(plan, 8)
    work = 4 * 32768 ** 2 * 1024 / 2 * (1 + 128 / 32768)
    saved = work * (1 / (0.3 * 989e12) - 1 / 335e12) + 2.5 * work * (1 / (0.245 * 989e12) - 1 / 322e12)
    assert saved == pytest.approx(6.488e-3, rel=1e-3)
    assert base.step_time_s - fa2.step_time_s == pytest.approx(saved, rel=1e-3)


def test_a_kernel_with_no_published_numbers_on_the_gpu_is_one_user_error():
    model = trace("llama:layers=1,hidden=512,heads=4,kv_heads=4,ffn=1024,vocab=512", seq=1024)
    with pytest.raises(UserError, match="no published throughput of attention kernel 'cudnn' on 'a100-80gb'") as err:
        Estimator(model, topologies.load("a100x8"), EstimateOptions(attention_kernel="cudnn"))
    assert "--attention-kernel profile" in err.value.fix
