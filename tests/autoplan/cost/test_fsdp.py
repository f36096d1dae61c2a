"""ZeRO-3 as FSDP2 overlaps it: prefetch depth, first gather / last reduce-scatter exposed, links
shared with per-layer collectives, reshard-after-forward, gradient sync per micro-batch or per step."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.fsdp import Piece, Policy, Unit, policy, step_exposure
from autoplan.cost.memory import fsdp_staging_bytes
from autoplan.plan import Plan

MODEL = "llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=4096,vocab=8000"


def _units(forward=(10.0, 10.0, 10.0), gather=(1.0, 1.0, 1.0), link=0.0, reduce=2.0, backward=20.0):
    """A root unit (no compute, gathered first, reduce-scattered last) and blocks; the last block is kept."""
    root = Unit(0.0, 0.0, 1.0, reduce, 0.0, 0.0, kept=True)
    blocks = [Unit(f, backward, g, reduce, link, 0.0, kept=i == len(forward) - 1)
              for i, (f, g) in enumerate(zip(forward, gather))]
    return [root] + blocks


def test_first_gathers_and_last_reduce_scatters_are_exposed_and_counted_per_microbatch():
    units = _units()
    # forward: the root's gather (1) and the first block's (1, nothing to hide behind) are exposed;
    # backward: reduce-scatters queue behind the re-gathers, the root's (2) runs after all compute: 4
    assert step_exposure([units], Policy(1, True, True), 1).seconds == pytest.approx(6.0)
    assert step_exposure([units], Policy(1, True, True), 2).seconds == pytest.approx(12.0)
    # reshard off: gathered once per step, still reduce-scattered every micro-batch (no no_sync)
    assert step_exposure([units], Policy(1, False, True), 2).seconds == pytest.approx(2.0 + 2 * 4.0)


def test_deeper_prefetch_hides_a_gather_behind_an_earlier_long_layer():
    units = _units(forward=(30.0, 10.0, 10.0), gather=(1.0, 15.0, 15.0), reduce=0.0)
    assert step_exposure([units], Policy(1, False, True), 1).seconds == pytest.approx(7.0)
    assert step_exposure([units], Policy(2, False, True), 1).seconds == pytest.approx(2.0)


def test_per_layer_collectives_on_the_same_links_slow_the_gathers():
    alone = _units(gather=(9.8, 9.8, 9.8), reduce=0.0)
    shared = _units(gather=(9.8, 9.8, 9.8), link=0.5, reduce=0.0)
    assert step_exposure([alone], Policy(1, False, True), 1).seconds == pytest.approx(10.8)
    assert step_exposure([shared], Policy(1, False, True), 1).seconds == pytest.approx(11.4)


@pytest.fixture(scope="module")
def fsdp16(traced):
    import topologies
    return traced(MODEL, seq=2048), topologies.load("h100x16")


def _est(fsdp16, plan, batch=32, **options):
    model, cluster = fsdp16
    return Estimator(model, cluster, EstimateOptions(**options)).estimate(Plan.parse(plan, num_gpus=16), batch)


def _dp(est, kind):
    return [p for p in est.primitives if p.axis == "dp" and p.kind == kind]


def test_zero3_across_nodes_exposes_some_traffic_and_reshard_off_trades_memory_for_it(fsdp16):
    on = _est(fsdp16, "dp=16,mbs=1,zero=3")                 # m = 2 micro-batches
    off = _est(fsdp16, "dp=16,mbs=1,zero=3", fsdp_reshard_after_forward=False)
    total = sum(p.time_s for p in on.primitives if p.axis == "dp")
    assert 0 < on.time_breakdown_s["dp_exposed"] < total
    # one collective per unit (the root, 8 blocks): the forward gathers all 9, the backward gathers
    # again all but the units kept gathered (the root, the last block), on 2 micro-batches
    assert sum(p.calls_per_step for p in _dp(on, "all_gather")) == 2 * 9 + 2 * 7
    assert sum(p.calls_per_step for p in _dp(off, "all_gather")) == 9          # the first forward only
    assert sum(p.calls_per_step for p in _dp(on, "reduce_scatter")) == 2 * 9   # every micro-batch (no no_sync)
    assert off.time_breakdown_s["dp_exposed"] < on.time_breakdown_s["dp_exposed"]
    assert off.memory_gib > on.memory_gib
    # without overlap every collective is exposed (priced per step, not per unit: dp.dp_comms)
    exposed_all = _est(fsdp16, "dp=16,mbs=1,zero=3", overlap_grad_reduce=False)
    rows = [p for p in exposed_all.primitives if p.axis == "dp"]
    assert exposed_all.time_breakdown_s["dp_exposed"] == pytest.approx(sum(p.time_s for p in rows), rel=1e-12)
    assert all(p.exposed_s == pytest.approx(p.time_s, rel=1e-12) for p in rows)


def test_zero3_under_pipeline_gathers_once_and_reduces_once_per_step(fsdp16):
    est = _est(fsdp16, "pp=2,dp=8,mbs=1,zero=3,schedule=1f1b")   # m = 4 micro-batches, 4 blocks + a root per rank
    assert sum(p.calls_per_step for p in _dp(est, "all_gather")) == 5
    assert sum(p.calls_per_step for p in _dp(est, "reduce_scatter")) == 5
    regather = _est(fsdp16, "pp=2,dp=8,mbs=1,zero=3,schedule=1f1b", fsdp_reshard_after_forward=True)
    # every forward gathers its 5 units, every backward the 3 not kept gathered
    assert sum(p.calls_per_step for p in _dp(regather, "all_gather")) == 4 * 5 + 4 * 3
    assert regather.memory_gib < est.memory_gib


def test_deeper_prefetch_holds_more_gathered_layers(fsdp16):
    one = _est(fsdp16, "dp=16,mbs=1,zero=3")
    two = _est(fsdp16, "dp=16,mbs=1,zero=3", fsdp_prefetch=2)
    assert two.memory_gib >= one.memory_gib         # here the loss buffers, not FSDP, set the peak
    assert two.time_breakdown_s["dp_exposed"] <= one.time_breakdown_s["dp_exposed"] + 1e-12
    plan = Plan.parse("dp=16,mbs=1,zero=3", num_gpus=16)
    staged = [fsdp_staging_bytes(plan, 100.0, 10.0, Policy(depth, True, True)) for depth in (1, 2)]
    assert staged[1] - staged[0] == pytest.approx(2 * 100.0)    # one more block of bf16 parameters


@pytest.mark.parametrize("freed, want", [(0.0, 6 * 100 + 2 * (100 + 10)),        # after the backward
                                         (500.0, 2 * (2 * 100 + 10)),            # during it
                                         (1e9, 2 * (2 * 100 + 10))])
def test_staging_is_the_larger_of_two_moments_of_a_blocks_backward(freed, want):
    """zero 3, a reduce-scatter every micro-batch, prefetch 1, a block of 100 parameters, a root
    of 10: during its backward the gathered block, the prefetched one and the root (2 B each);
    after it, its activations (``freed``) gone and the block resharded, its bf16 gradient and the
    fp32 reduce-scatter input (6 B per parameter) beside the prefetched block and the root."""
    plan = Plan.parse("dp=16,mbs=1,zero=3", num_gpus=16)
    assert fsdp_staging_bytes(plan, 100.0, 10.0, Policy(1, True, True), freed=freed) == pytest.approx(want)
    # zero 2 keeps the parameters gathered: only the gradient staging, after the backward
    zero2 = Plan.parse("dp=16,mbs=1,zero=2", num_gpus=16)
    assert fsdp_staging_bytes(zero2, 100.0, 10.0, Policy(1, False, True), freed=freed) == pytest.approx(
        max(0.0, 600.0 - freed))


def test_zero2_is_fsdp_that_never_reshards_and_exposes_each_backwards_last_reduce_scatter():
    pol = policy(EstimateOptions(fsdp_reshard_after_forward=True), Plan.parse("dp=8,zero=2", num_gpus=8))
    assert pol == Policy(1, False, True)
    # gathered once (root 1 + first block 1 exposed); every backward: blocks end at 20, 40, 60 and
    # their reduce-scatters (2 each) follow them; the root's runs 62..64 after all compute: 4 each
    assert step_exposure([_units()], pol, 3).seconds == pytest.approx(2.0 + 3 * 4.0)


def test_zero2_across_nodes_shows_exposed_gradient_traffic(fsdp16):
    est = _est(fsdp16, "dp=16,mbs=1,zero=2")                # m = 2 micro-batches
    assert est.time_breakdown_s["dp_exposed"] > 0 and est.comm_exposed_s > 0
    assert sum(p.calls_per_step for p in _dp(est, "reduce_scatter")) == 2 * 9    # the root and 8 blocks
    assert sum(p.calls_per_step for p in _dp(est, "all_gather")) == 9
    zero3 = _est(fsdp16, "dp=16,mbs=1,zero=3")
    assert est.time_breakdown_s["dp_exposed"] < zero3.time_breakdown_s["dp_exposed"]


def test_gradients_reduced_in_fp16_halve_the_dp_bytes(fsdp16):
    fp32 = _est(fsdp16, "dp=16,mbs=1,zero=0", overlap_grad_reduce=False)
    fp16 = _est(fsdp16, "dp=16,mbs=1,zero=0", overlap_grad_reduce=False, grad_reduce_bytes=2.0)
    (a,), (b,) = _dp(fp32, "all_reduce"), _dp(fp16, "all_reduce")
    assert b.bytes_per_call == pytest.approx(a.bytes_per_call / 2)
    assert fp16.time_breakdown_s["dp_exposed"] < fp32.time_breakdown_s["dp_exposed"]
    z3 = _est(fsdp16, "dp=16,mbs=1,zero=3", grad_reduce_bytes=2.0)
    (rs,) = _dp(z3, "reduce_scatter")
    (rs32,) = _dp(_est(fsdp16, "dp=16,mbs=1,zero=3"), "reduce_scatter")
    assert rs.bytes_per_call == pytest.approx(rs32.bytes_per_call / 2)


# ---- the collectives the exposure is charged to ------------------------------------------------------

def _charged(exposure):
    """{(kind, phase): (calls, seconds, exposed)} of an Exposure's collectives, and its invariants:
    each collective's exposed seconds within its time, all of them adding up to the exposure."""
    assert all(0 <= c.exposed_s <= c.seconds for c in exposure.colls)
    assert sum(c.exposed_s for c in exposure.colls) == pytest.approx(exposure.seconds, rel=1e-12, abs=1e-15)
    return {(c.kind, c.when): (c.calls, pytest.approx(c.seconds), pytest.approx(c.exposed_s)) for c in exposure.colls}


def test_the_exposure_is_charged_to_the_collectives_the_compute_waits_for():
    pol = Policy(1, False, True)                    # ZeRO-2, worked out in the test above
    out = step_exposure([_units()], pol, 3, detail=True)
    assert out.seconds == pytest.approx(14.0)
    # gathered once: the root's (1) and the first block's (1) exposed, the others hidden; every
    # backward waits for its first block's reduce-scatter (60..62) and the root's (62..64)
    assert _charged(out) == {("all_gather", "forward"): (4, 4.0, 2.0),
                             ("reduce_scatter", "backward"): (3 * 4, 3 * 8.0, 3 * 4.0)}
    assert step_exposure([_units()], pol, 3).colls == ()         # not asked for: the search's inner loop


def test_charged_collectives_last_their_time_on_a_shared_link_and_reshard_gathers_again():
    shared = step_exposure([_units(gather=(9.8, 9.8, 9.8), link=0.5, reduce=0.0)], Policy(1, False, True), 1,
                           detail=True)
    # the second and third blocks' gathers wait for the previous block's per-layer collectives (0.5)
    assert _charged(shared) == {("all_gather", "forward"): (4, 1.0 + 9.8 + 2 * 10.3, 11.4)}
    regather = step_exposure([_units()], Policy(1, True, True), 2, detail=True)
    rows = _charged(regather)
    assert rows[("all_gather", "forward")][0] == 2 * 4 and rows[("all_gather", "backward")][0] == 2 * 2
    assert rows[("reduce_scatter", "backward")][0] == 2 * 4
    partial = step_exposure([_units()], Policy(1, True, True), 2, hide=0.5, detail=True)
    _charged(partial)


def test_a_units_dense_and_expert_collectives_are_charged_on_their_own_groups():
    dense, expert = Piece((0, 1, 2, 3), 100.0, 0.6), Piece((0, 2), 50.0, 0.4)
    root = Unit(0.0, 0.0, 1.0, 0.0, 0.0, 0.0, kept=True, gathers=(dense, expert))
    block = Unit(0.1, 0.2, 1.0, 0.0, 0.0, 0.0, kept=True, gathers=(dense, expert))
    out = step_exposure([[root, block]], Policy(1, False, True), 1, detail=True)
    by_group = {c.ranks: c for c in out.colls}
    assert by_group[dense.ranks].calls == by_group[expert.ranks].calls == 2
    assert (by_group[dense.ranks].nbytes, by_group[expert.ranks].nbytes) == (100.0, 50.0)
    assert by_group[dense.ranks].seconds == pytest.approx(1.2) and by_group[expert.ranks].seconds == pytest.approx(0.8)
    # both gathers wait whole (nothing computes before the block): 2 s, shared 0.6 : 0.4
    assert out.seconds == pytest.approx(2.0)
    assert by_group[dense.ranks].exposed_s == pytest.approx(1.2)
    assert by_group[expert.ranks].exposed_s == pytest.approx(0.8)


@pytest.mark.parametrize("plan, options", [("dp=16,mbs=1,zero=3", {}), ("dp=16,mbs=1,zero=2", {}),
                                           ("pp=2,dp=8,mbs=1,zero=3,schedule=1f1b", {}),
                                           ("pp=2,dp=8,mbs=1,zero=3,schedule=1f1b",
                                            {"fsdp_reshard_after_forward": True}),
                                           ("dp=16,mbs=1,zero=3", {"fsdp_prefetch": 2}),
                                           ("tp=2,dp=8,mbs=1,zero=3", {}),
                                           ("pp=2,dp=8,mbs=1,zero=3,schedule=1f1b", {"overlap_grad_reduce": False})])
def test_the_table_holds_every_exposed_second_of_zero_2_and_3(fsdp16, plan, options):
    """The seconds the step charges for DP (the step less everything else it adds) are the dp
    rows' exposed seconds, none of them beyond its row's time (dp within a node shares NVLink)."""
    est = _est(fsdp16, plan, **options)
    rows = _dp(est, "all_gather") + _dp(est, "reduce_scatter")
    charged = est.step_time_s - sum(v for k, v in est.time_breakdown_s.items() if k != "dp_exposed")
    assert charged > 0
    assert sum(p.exposed_s for p in rows) == pytest.approx(charged, rel=1e-9)
    assert all(0 <= p.exposed_s <= p.time_s * (1 + 1e-12) for p in rows)
