"""The host's launch floor per phase (``cost.parts.host_bound``): the host issues one launch per
``host_floor_s`` while the GPU runs the queue, so a phase lasts max(GPU + exposed tp, N · floor)."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.parts import Phases
from autoplan.cost.parts import host_bound as _host_bound
from autoplan.cost.types import AxisCost, Comm
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding

MODEL = "gpt:layers=2,hidden=256,heads=4,vocab=1024,max_seq=256,attention=eager"


def _sharding(**kw):
    base = dict(strategies={}, placements={}, param_placements={}, collectives=(), forward_s=1e-3,
                backward_s=2e-3, wgrad_s=1e-3, recompute_s=0.0, saved_bytes=0.0, wgrad_held_bytes=0.0,
                b_freed_bytes=0.0, param_numel=0,
                objective_s=0.0, gap=0.0, solve_seconds=0.0, forward_launches=40, backward_launches=70)
    base.update(kw)
    return BlockSharding(**base)


def host_bound(floor, bs, tp, backward_s):
    """``parts.host_bound`` on a block's launches and GPU seconds and its tp collectives."""
    return _host_bound(floor, (bs.forward_launches, bs.backward_launches),
                       Phases(bs.forward_s, backward_s, bs.wgrad_s, tp.exposed_fwd_s, tp.exposed_bwd_s), tp)


def _tp(fwd=0.3e-3, bwd=0.3e-3):
    comms = tuple(Comm("tp", "all_reduce", 1.0, s / 2, s / 2, phase) for phase, s in
                  (("forward", fwd), ("forward", fwd), ("backward", bwd), ("backward", bwd)))
    return AxisCost(fwd, bwd, comms)


def test_host_bound_phase_is_its_launches_times_the_floor_less_the_exposed_collectives():
    # forward: 40 kernels + 2 all-reduces at 50 us = 2.1 ms > 1 ms GPU + 0.3 ms tp: 2.1 - 0.3 = 1.8
    # backward: 70 + 2 launches = 3.6 ms > 3 ms + 0.3 ms: B and W stretch by 3.3 / 3 = 1.1
    f, b, w = host_bound(50e-6, _sharding(), _tp(), 2e-3)
    assert (f, b, w) == pytest.approx((1.8e-3, 2.2e-3, 1.1e-3))


def test_gpu_bound_phase_keeps_its_gpu_seconds():
    assert host_bound(10e-6, _sharding(), _tp(), 2e-3) == pytest.approx((1e-3, 2e-3, 1e-3))
    assert host_bound(0.0, _sharding(), _tp(), 2e-3) == (1e-3, 2e-3, 1e-3)


def test_a_host_bound_micro_batch_costs_the_same_whatever_its_size(traced, profile_with):
    import topologies
    path, _ = profile_with("a100", host_floor_s=1e-3, name="slow-host")     # 1 ms per launch: host-bound
    est = Estimator(traced(MODEL, seq=256), topologies.load("a100x8"), EstimateOptions(profile=path))
    one = est.estimate(Plan.parse("tp=1,dp=8,mbs=1", num_gpus=8), 32)    # 4 micro-batches of 1
    two = est.estimate(Plan.parse("tp=1,dp=8,mbs=2", num_gpus=8), 64)    # 4 micro-batches of 2
    assert one.time_breakdown_s["compute"] == pytest.approx(two.time_breakdown_s["compute"])
    gpu = Estimator(traced(MODEL, seq=256), topologies.load("a100x8")).estimate(
        Plan.parse("tp=1,dp=8,mbs=2", num_gpus=8), 64)
    assert two.time_breakdown_s["compute"] > 10 * gpu.time_breakdown_s["compute"]
