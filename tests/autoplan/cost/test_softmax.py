"""Megatron's fused scale-mask-softmax and its fp32 fallback (``cost.softmax``), on a stack whose
profile says it runs Megatron's kernel (``softmax_kernel: megatron``)."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.softmax import FALLBACK_KERNELS, fused_kernel_available
from autoplan.plan import Plan

MODEL = "gpt:layers=2,hidden=512,heads=16,vocab=1024,max_seq=1024,attention=eager"


def test_the_fused_kernel_exists_for_megatrons_shapes_only():
    # attn_batches = micro-batch x heads per rank: 16 heads at tp 8 and micro-batch 1 give 2
    assert not fused_kernel_available(2, 1024, 1024)
    assert fused_kernel_available(4, 1024, 1024)
    assert fused_kernel_available(32, 2048, 2048)
    assert not fused_kernel_available(32, 8192, 8192)          # sk above 4096
    assert not fused_kernel_available(32, 1024, 16)            # sk must exceed 16
    # sk <= 128: two batches per warp, 8 per block: attn_batches 4 is not enough
    assert not fused_kernel_available(4, 128, 128)
    assert fused_kernel_available(8, 128, 128)


def _estimator(traced, profile_with, kernel: str):
    import topologies
    path, data = profile_with("a100-megatron-deepspeed", softmax_kernel=kernel)
    return Estimator(traced(MODEL, seq=1024), topologies.load("a100x8"), EstimateOptions(profile=path)), data


def test_the_fallback_costs_three_host_launches_each_way_per_layer(traced, profile_with):
    megatron, data = _estimator(traced, profile_with, "megatron")
    plain, _ = _estimator(traced, profile_with, "")
    # tp 8, mbs 1: 16 heads / 8 x 1 = 2 attention batches -> the fp32 fallback; the layer is
    # host-bound on this stack, so each of its two phases grows by 3 launches x the host floor
    fallback = Plan.parse("tp=8,mbs=1", num_gpus=8)
    extra = (megatron.estimate(fallback, 8).time_breakdown_s["compute"]
             - plain.estimate(fallback, 8).time_breakdown_s["compute"])
    micro_batches, layers, phases = 8, 2, 2
    assert extra == pytest.approx(micro_batches * layers * phases * FALLBACK_KERNELS * data["host_floor_s"], rel=1e-6)
    # mbs 2: 4 attention batches, the fused kernel runs: the traced graph's price, unchanged
    fused = Plan.parse("tp=8,mbs=2", num_gpus=8)
    assert megatron.estimate(fused, 8).step_time_s == plain.estimate(fused, 8).step_time_s
