"""The search's memory bound (``bounds.states_lower_bound``): below the estimate's peak for every
plan of a mesh, and at one pipeline rank exactly the model states the runtime keeps, computed
here from bytes per parameter (not from the code under test)."""
import pytest

from autoplan.cost.bounds import states_lower_bound
from autoplan.plan import Plan
from costmodels.memory import GIB

LLAMA = "llama:layers=8,hidden=256,heads=4,kv_heads=2,ffn=768,vocab=1024"


def expected_states(n: float, zero: int, dp: int, pp: int, m: int) -> float:
    """Bytes per GPU of ``n`` parameters' states: Megatron's bf16 weight and fp32 gradient with the
    fp32 master and Adam moments (sharded under ZeRO-1); FSDP2's fp32 shard, gradient shard (none
    yet at the peak of a one-micro-batch step) and moments, its bf16 weight gathered under ZeRO-2
    and under pipelines (no reshard after forward), and under pipelines the fp32 gradients
    accumulated unsharded until the step's one reduce-scatter."""
    if zero <= 1:
        return n * (2 + 4 + 12 / (dp if zero == 1 else 1))
    gathered = 2 * n if zero == 2 or pp > 1 else 0.0
    grads = 0.0 if m == 1 else 4 * n / dp
    unsharded = 4 * n if pp > 1 else 0.0
    return gathered + 4 * n / dp + grads + 8 * n / dp + unsharded


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("batch", [8, 32])             # one micro-batch per dp rank, or several
def test_one_rank_bound_is_its_model_states(setup, zero, batch):
    graph, _, est = setup(LLAMA, "h100x8", seq=512)
    plan = Plan.parse(f"dp=8,zero={zero}")
    m = plan.microbatches(batch)
    assert states_lower_bound(est, plan, batch) == pytest.approx(
        expected_states(graph.param_count, zero, 8, 1, m), rel=1e-9)
    e = est.estimate(plan, batch)
    states = sum(e.memory_breakdown_gib[k] for k in ("params", "grads", "optimizer")) * GIB
    assert states == pytest.approx(states_lower_bound(est, plan, batch), rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("pp,schedule,vpp", [(2, "1f1b", 1), (2, "interleaved", 2), (4, "zbv", 2)])
def test_pipeline_bound_is_below_every_plans_peak(setup, zero, pp, schedule, vpp):
    """The bound holds the even share of the parameters, so the busiest rank of any cut, schedule
    and recompute policy holds at least it; under FSDP it counts the gathered bf16 weights and the
    unsharded fp32 gradients a pipeline keeps."""
    graph, _, est = setup(LLAMA, "h100x8", seq=512)
    dp = 8 // pp
    for batch in (dp * 4, dp * 16):
        for recompute in ("none", "full"):
            plan = Plan.parse(f"dp={dp},pp={pp},zero={zero},schedule={schedule},vpp={vpp},"
                              f"recompute={recompute}")
            bound = states_lower_bound(est, plan, batch)
            assert bound <= est.estimate(plan, batch).memory_gib * GIB
            assert bound == pytest.approx(expected_states(graph.param_count / pp, zero, dp, pp,
                                                          plan.microbatches(batch)), rel=1e-9)


@pytest.mark.parametrize("spec", ["dp=2,pp=4,zero=1,recompute=none", "dp=2,pp=4,zero=3,schedule=zbv,vpp=2",
                                  "dp=4,pp=2,zero=2,schedule=interleaved,vpp=2,recompute=full",
                                  "dp=2,pp=4,zero=1,recompute=none-selective-op-full,layers=1-3-2-2"])
def test_plan_memory_is_the_estimates_to_the_bit(setup, spec):
    """What the stage search reads before simulating (``plan_memory``: per-rank totals at once)
    is the estimate's memory, every rank to the bit."""
    from autoplan.cost.bounds import plan_memory

    _, _, est = setup(LLAMA, "h100x8", seq=512)
    plan = Plan.parse(spec)
    e, mem = est.estimate(plan, 32), plan_memory(est, plan, 32)
    assert mem.memory_per_stage_gib == e.memory_per_stage_gib
    assert (mem.memory_gib, mem.fits) == (e.memory_gib, e.fits)
