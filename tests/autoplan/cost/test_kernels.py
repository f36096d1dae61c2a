"""The engine's kernels (EstimateOptions.kernels): Megatron-Core's fused SwiGLU keeps its input only."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import Plan

LLAMA = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=768,vocab=1024"
FFN, SEQ = 768, 512


def saved(setup, kernels, plan_text, recompute):
    graph, cluster, _ = setup(LLAMA, "h100x8", seq=SEQ)
    est = Estimator(graph, cluster, EstimateOptions(kernels=kernels))
    plan = Plan.parse(plan_text)
    return est.part(graph.blocks[0].kind, plan, recompute, Mesh.of(plan))


@pytest.mark.parametrize("plan_text,tp,mbs", [("dp=8,zero=1", 1, 1), ("tp=2,dp=4,sp=on,mbs=2", 2, 2)])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_fused_swiglu_drops_the_saved_silu_output(setup, plan_text, tp, mbs, recompute):
    eager = saved(setup, "eager", plan_text, recompute)
    fused = saved(setup, "megatron-core", plan_text, recompute)
    # SiLU(gate): b·s·ffn/tp bf16 elements (the MLP intermediate is sharded over tp)
    assert eager.saved_bytes - fused.saved_bytes == pytest.approx(mbs * SEQ * FFN / tp * 2)
    assert (fused.forward_s, fused.backward_s) == (eager.forward_s, eager.backward_s)


def test_full_recompute_and_the_transient_follow_the_kernels(setup):
    eager = saved(setup, "eager", "dp=8,zero=1", "full")
    fused = saved(setup, "megatron-core", "dp=8,zero=1", "full")
    assert fused.saved_bytes == eager.saved_bytes                       # the block input only
    # what recomputing re-materialises is the fused layer's saved bytes, not the eager layer's
    assert eager.recompute_transient_bytes - fused.recompute_transient_bytes == pytest.approx(SEQ * FFN * 2)


def test_unknown_kernels_is_a_user_error(setup):
    with pytest.raises(UserError, match="unknown kernels 'te'"):
        saved(setup, "te", "dp=8,zero=1", "none")
