"""cost/dp.py against numbers worked by hand: ZeRO 0–3 collectives, their exposure, the optimizer step.

Expected values come from the table of dp.py's docstring (which collectives, how many calls, how many
bytes: fp32 gradients, bf16 parameters) and the α–β formulas of costmodels/collectives.py written out
below with the bandwidths and latencies of h100x64 (8 DGX H100 nodes, one rail group, one pod), read
from the cluster, never from the functions under test.
"""
from __future__ import annotations

import math

import pytest
import yaml

import topologies
from autoplan.axes import DENSE_DP, EXPERT_DP
from autoplan.cost import dp
from autoplan.cost.context import PlanContext
from autoplan.cost.fsdp import Exposure, Policy
from autoplan.cost.prices import Prices
from autoplan.cost.types import DpComm, EstimateOptions
from autoplan.ir import ModelInfo
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.compute import PROFILE_DIR

CLUSTER = topologies.load("h100x64")
GRAD, PARAM = 4.0, 2.0                   # bytes per reduced gradient (fp32) and per gathered parameter (bf16)


# ---- the calls under test, one place each (their signatures are being reshaped) -----------------

def _ctx(plan: Plan, grad_bytes: float = GRAD) -> PlanContext:
    return PlanContext(plan, Mesh.of(plan), Prices(CLUSTER), EstimateOptions(grad_reduce_bytes=grad_bytes),
                       ModelInfo("none"), seq_len=0, hidden=0, activation_bytes=0.0)   # dp reads none of them


def _dp_comms(plan, dense, expert, dp_ranks, edp_ranks, m, pol=None, grad_bytes=GRAD) -> list[DpComm]:
    """``dp_comms`` on ``plan``'s dense and expert dp groups, which the test spells out: ``dp_ranks``
    and ``edp_ranks``."""
    ctx = _ctx(plan, grad_bytes)
    assert (ctx.mesh.group(DENSE_DP), ctx.mesh.group(EXPERT_DP)) == (tuple(dp_ranks), tuple(edp_ranks))
    return dp.dp_comms(ctx, dense, expert, m, pol)


def _dp_exposed(colls, m, **kw) -> float:
    """The seconds ``dp_exposed`` charges, checked against the collectives it charges them to."""
    seconds, charged = dp.dp_exposed(colls, m, **kw)
    assert sum(c.exposed_s for c in charged) == pytest.approx(seconds, rel=1e-12, abs=1e-15)
    assert all(0 <= c.exposed_s <= c.seconds for c in charged)
    return seconds


def _optimizer(numel, plan, dp_size) -> float:
    ctx = _ctx(plan)
    assert len(ctx.mesh.group(DENSE_DP)) == dp_size
    return dp.optimizer_seconds(ctx, numel)


# ---- α–β by hand (costmodels/collectives.py, module docstring) ------------------------------------

C = CLUSTER
B_RING = C.gpu.nvlink_bw * C.nvlink_efficiency                     # 450e9 · 0.822
A0, A_NVL, A_RAIL = C.launch_latency, C.nvlink_latency, C.rail_latency
# a group with g members per node: c = 8 // g groups share the node, u = 8 GPUs on its 8 NICs
B_NET = C.nics_per_node * C.nic_bw * C.nic_efficiency / C.gpus_per_node    # 47 GB/s per GPU
assert not C.sharp and C.num_pods == 1 and C.num_gpus <= C.leaf_size      # one rail group: α_L = rail
with open(f"{PROFILE_DIR}/h100.yaml") as f:
    PROFILE = yaml.safe_load(f)


def b_nvls(k):
    return C.gpu.nvlink_bw * C.nvls_efficiency * k / (k + 1)


def ring_gather(s, n, m=1):
    """reduce_scatter / all_gather of S over n ranks in m domains (flat ring when m > 1)."""
    k = n / m
    if m == 1:
        return (n - 1) / n * s / B_RING + A0 + (n - 1) * A_NVL
    traffic = (n - 1) / n * s
    return max(traffic / B_RING, traffic / k / B_NET) + A0 + (n - m) * A_NVL + (m - 1) * A_RAIL


def all_reduce(s, n, m=1):
    """The fastest of NCCL's all-reduce algorithms over n ranks in m domains of one rail group."""
    k = n / m
    intra = []
    if k > 1:
        intra = [(2 * (k - 1) / k * s / B_RING, 2 * (k - 1) * A_NVL, "ring"), (s / b_nvls(k), 2 * A_NVL, "nvls")]
    if m == 1:
        return min(bw + A0 + lat for bw, lat, _ in intra)
    traffic = 2 * (n - 1) / n * s
    flat = max(traffic / B_RING, traffic / k / B_NET) + A0 + (2 * (n - 1) - 2 * m) * A_NVL + 2 * m * A_RAIL
    out = [flat]
    for bw_in, lat_in, name in intra or [(0.0, 0.0, "")]:
        inter = [(2 * s / k, 2 * math.ceil(math.log2(m)) * A_RAIL)]                  # double binary tree
        if name == "nvls":
            inter.append((2 * (m - 1) / m * s / k, 2 * (m - 1) * A_RAIL))           # NVLS + ring
        out += [max(bw_in, e / B_NET) + A0 + lat_in + lat_out for e, lat_out in inter]
    return min(out)


def _by(colls, kind):
    return [c for c in colls if c.kind == kind]


# ---- dp_comms ---------------------------------------------------------------------------------------

def test_zero0_all_reduces_fp32_gradients_once_nvls_inside_a_node():
    n = 1_000_000
    colls = _dp_comms(Plan(dp=8, zero=0), n, 0, range(8), range(8), m=4)
    assert [(c.kind, c.nbytes, c.calls, c.when, c.ranks) for c in colls] == \
        [("all_reduce", 4 * n, 1, "grad", tuple(range(8)))]
    ring = 2 * 7 / 8 * 4 * n / B_RING + A0 + 14 * A_NVL
    nvls = 4 * n / (450e9 * 0.686 * 8 / 9) + A0 + 2 * A_NVL
    assert nvls < ring                                           # NVLS wins on 8 H100s
    assert colls[0].seconds == pytest.approx(nvls, rel=1e-12)
    assert colls[0].seconds == pytest.approx(all_reduce(4 * n, 8), rel=1e-12)


def test_zero1_reduce_scatters_gradients_and_all_gathers_bf16_parameters():
    n = 3_000_000
    colls = _dp_comms(Plan(dp=8, zero=1), n, 0, range(8), range(8), m=4)
    assert [(c.kind, c.nbytes, c.calls, c.when) for c in colls] == \
        [("reduce_scatter", GRAD * n, 1, "grad"), ("all_gather", PARAM * n, 1, "param")]
    assert colls[0].seconds == pytest.approx(7 / 8 * 12e6 / B_RING + A0 + 7 * A_NVL, rel=1e-12)
    assert colls[1].seconds == pytest.approx(7 / 8 * 6e6 / B_RING + A0 + 7 * A_NVL, rel=1e-12)


def test_zero1_across_two_nodes_is_a_flat_ring_bounded_by_the_slower_of_nvlink_and_nic():
    n = 50_000_000                                   # 200 MB of gradients over ranks 0..15 (2 domains)
    colls = _dp_comms(Plan(dp=16, zero=1), n, 0, range(16), range(16), m=1)
    rs = 15 / 16 * GRAD * n
    # NVLink: 187.5 MB / 369.9 GB/s = 0.507 ms; network: 187.5 MB / 8 rails / 47 GB/s = 0.499 ms
    expected = max(rs / B_RING, rs / 8 / B_NET) + A0 + 14 * A_NVL + 1 * A_RAIL
    assert expected == pytest.approx(rs / B_RING + A0 + 14 * A_NVL + A_RAIL)
    assert _by(colls, "reduce_scatter")[0].seconds == pytest.approx(expected, rel=1e-12)
    assert _by(colls, "all_gather")[0].seconds == pytest.approx(ring_gather(PARAM * n, 16, 2), rel=1e-12)


def test_zero0_one_gpu_per_node_picks_the_tree_for_small_and_the_ring_for_large_buffers():
    ranks = range(0, 64, 8)                          # tp=8 inside each node: dp group 0, 8, …, 56
    for n, winner in ((1_000_000, "tree"), (200_000_000, "ring")):
        s = GRAD * n
        ring = 2 * 7 / 8 * s / B_NET + A0 + (14 - 16) * A_NVL + 16 * A_RAIL     # NCCL: 2m network steps
        tree = 2 * s / B_NET + A0 + 2 * 3 * A_RAIL                              # 2·ceil(log2 8) steps
        [c] = _dp_comms(Plan(tp=8, dp=8, zero=0), n, 0, ranks, ranks, m=1)
        assert c.seconds == pytest.approx(min(ring, tree), rel=1e-12)
        assert (tree < ring) == (winner == "tree")


def test_zero0_two_full_nodes_all_reduce_is_the_best_hierarchical_algorithm():
    for n in (100_000, 10_000_000, 500_000_000):
        [c] = _dp_comms(Plan(dp=16, zero=0), n, 0, range(16), range(16), m=1)
        assert c.seconds == pytest.approx(all_reduce(GRAD * n, 16, 2), rel=1e-12)


def test_expert_parameters_reduce_over_the_expert_dp_group():
    # tp-cp-ep-dp-pp with ep=2, dp=4: dense dp = cp·ep·dp = 0..3, expert dp = cp·dp = {0, 2}
    plan = Plan(dp=4, ep=2, zero=1)
    colls = _dp_comms(plan, 1_000_000, 4_000_000, (0, 1, 2, 3), (0, 2), m=2)
    dense = [c for c in colls if c.ranks == (0, 1, 2, 3)]
    expert = [c for c in colls if c.ranks == (0, 2)]
    assert [c.nbytes for c in dense] == [4e6, 2e6] and [c.nbytes for c in expert] == [16e6, 8e6]
    assert expert[0].seconds == pytest.approx(1 / 2 * 16e6 / B_RING + A0 + A_NVL, rel=1e-12)
    assert expert[1].seconds == pytest.approx(1 / 2 * 8e6 / B_RING + A0 + A_NVL, rel=1e-12)
    # nothing to reduce: no parameters, or a group of one
    assert _dp_comms(plan, 1_000_000, 0, (0, 1, 2, 3), (0, 2), m=2) == dense
    assert _dp_comms(Plan(dp=4, ep=4, zero=1), 1_000_000, 4_000_000, (0, 1, 2, 3), (0,), m=2) == dense  # ep = dp
    assert _dp_comms(Plan(dp=1), 1_000_000, 0, (0,), (0,), m=2) == []


def test_grad_bytes_sets_the_reduced_gradient_size():
    [c] = _dp_comms(Plan(dp=8, zero=0), 1_000_000, 0, range(8), range(8), m=1, grad_bytes=2.0)
    assert c.nbytes == 2e6 and c.seconds == pytest.approx(all_reduce(2e6, 8), rel=1e-12)


def test_zero3_at_pp1_gathers_twice_and_reduce_scatters_once_per_microbatch():
    n, m = 2_000_000, 4
    colls = _dp_comms(Plan(dp=8, zero=3), n, 0, range(8), range(8), m=m)   # FSDP2 defaults: reshard on
    t_ag, t_rs = ring_gather(PARAM * n, 8), ring_gather(GRAD * n, 8)
    assert sum(c.calls for c in _by(colls, "all_gather")) == 2 * m
    assert sum(c.calls for c in _by(colls, "reduce_scatter")) == m
    assert sum(c.seconds for c in _by(colls, "all_gather")) == pytest.approx(2 * m * t_ag, rel=1e-12)
    assert sum(c.seconds for c in _by(colls, "reduce_scatter")) == pytest.approx(m * t_rs, rel=1e-12)
    # the forward gathers and the reduce-scatters recur every micro-batch
    assert dp.per_microbatch_seconds(colls, m) == pytest.approx(t_ag + t_rs, rel=1e-12)


def test_zero2_at_pp1_gathers_once_and_reduce_scatters_every_microbatch():
    n, m = 2_000_000, 4
    colls = _dp_comms(Plan(dp=8, zero=2), n, 0, range(8), range(8), m=m)
    assert [(c.kind, c.calls) for c in colls] == [("all_gather", 1), ("reduce_scatter", m)]
    assert colls[0].seconds == pytest.approx(ring_gather(PARAM * n, 8), rel=1e-12)
    assert colls[1].seconds == pytest.approx(m * ring_gather(GRAD * n, 8), rel=1e-12)


def test_zero3_under_pp_gathers_and_reduces_once_per_step():
    n, m = 2_000_000, 8
    colls = _dp_comms(Plan(pp=2, dp=4, zero=3), n, 0, range(4), range(4), m=m)
    assert [(c.kind, c.calls) for c in colls] == [("all_gather", 1), ("reduce_scatter", 1)]
    assert dp.per_microbatch_seconds(colls, m) == 0.0
    assert sum(c.seconds for c in colls) == pytest.approx(ring_gather(PARAM * n, 4) + ring_gather(GRAD * n, 4),
                                                          rel=1e-12)


def test_zero3_reshard_with_one_reduction_per_step_gathers_again_in_every_backward():
    n, m = 1_000_000, 4
    colls = _dp_comms(Plan(dp=8, zero=3), n, 0, range(8), range(8), m=m, pol=Policy(1, True, False))
    # forward gathers m, backward gathers m (1 that reduces + m − 1 that only gather), one reduce-scatter
    assert sum(c.calls for c in _by(colls, "all_gather")) == 2 * m
    assert sum(c.calls for c in _by(colls, "reduce_scatter")) == 1
    assert sum(c.seconds for c in colls) == pytest.approx(
        2 * m * ring_gather(PARAM * n, 8) + ring_gather(GRAD * n, 8), rel=1e-12)


# ---- dp_exposed: the exposure algebra --------------------------------------------------------------

def _c(kind, seconds, when):
    return DpComm(kind, 1.0, 1, seconds, (0, 1), when)


def test_once_per_step_traffic_hides_behind_the_last_backward_and_first_forward():
    colls = [_c("reduce_scatter", 3.0, "grad"), _c("all_gather", 2.0, "param")]
    # max(0, 3 − 1) + max(0, 2 − 0.5)
    assert _dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5) == pytest.approx(3.5)
    # half the windows: max(0, 3 − 0.5) + max(0, 2 − 0.25)
    assert _dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5, hide=0.5) == pytest.approx(4.25)
    assert _dp_exposed(colls, 4, overlap=True, last_backward=5.0, first_forward=5.0) == 0.0
    assert _dp_exposed(colls, 4, overlap=False, last_backward=5.0, first_forward=5.0) == pytest.approx(5.0)


def test_per_microbatch_traffic_hides_behind_each_microbatchs_compute():
    colls = [_c("all_gather", 8.0, "zero3"), _c("reduce_scatter", 4.0, "zero3")]   # 3 s per micro-batch at m=4
    # 4 · max(0, 3 − (0.5 + 1))
    assert _dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5) == pytest.approx(6.0)
    assert _dp_exposed(colls, 4, overlap=True, last_backward=2.0, first_forward=1.0) == 0.0


def test_each_term_is_charged_to_its_own_collectives():
    colls = [_c("reduce_scatter", 3.0, "grad"), _c("all_gather", 2.0, "param"), _c("all_gather", 6.0, "zero3"),
             _c("reduce_scatter", 2.0, "zero3")]
    seconds, charged = dp.dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5)
    # grad: 3 − 1, param: 2 − 0.5, per micro-batch 4 · (2 − 1.5) shared 6 : 2
    assert [c.exposed_s for c in charged] == pytest.approx([2.0, 1.5, 1.5, 0.5])
    assert seconds == pytest.approx(5.5)


def test_a_simulated_fsdp_exposure_replaces_the_formula_only_with_overlap():
    colls = [_c("all_gather", 8.0, "zero3"), _c("reduce_scatter", 4.0, "zero3")]
    simulated = [DpComm("all_gather", 1.0, 9, 9.0, (0, 1), "forward", 0.7)]
    zero3 = Exposure(0.7, tuple(simulated))
    assert _dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5, zero3=zero3) == 0.7
    assert dp.dp_exposed(colls, 4, overlap=True, last_backward=1.0, first_forward=0.5, zero3=zero3)[1] == simulated
    assert _dp_exposed(colls, 4, overlap=False, last_backward=1.0, first_forward=0.5,
                       zero3=zero3) == pytest.approx(12.0)
    assert _dp_exposed([], 4, overlap=False, last_backward=0.0, first_forward=0.0) == 0.0


# ---- optimizer_seconds ----------------------------------------------------------------------------

def test_optimizer_step_streams_32_bytes_per_parameter_of_the_shard():
    hbm = C.gpu.hbm_bw * PROFILE["memory_fraction"]          # 3.35 TB/s · 0.85
    n = 8e9
    assert _optimizer(n, Plan(dp=8, zero=1), 8) == pytest.approx(n / 8 * 32 / hbm, rel=1e-12)   # 0.112 s
    assert _optimizer(n, Plan(dp=8, zero=3), 8) == pytest.approx(n / 8 * 32 / hbm, rel=1e-12)
    assert _optimizer(n, Plan(dp=8, zero=0), 8) == pytest.approx(n * 32 / hbm, rel=1e-12)       # unsharded
