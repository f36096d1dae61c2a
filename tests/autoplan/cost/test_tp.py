"""cost/tp.py against numbers worked by hand: the block's tp collectives, all exposed.

``tp_cost`` reads the collectives of a solved block layout: every one is on the critical path, the
weight-gradient ones count in backward, reduce-scatters and all-gathers are sequence parallelism's when
SP is on.  The expected seconds are the α–β formulas of costmodels/collectives.py written out below
with h100x64's links read from the cluster, applied to each collective's kind and size; for Megatron's
layouts the collectives themselves are worked by hand (2 all-reduces of b·s·h·2 bytes per pass without
SP, Shoeybi et al. 2019 §3; 2 all-gathers + 2 reduce-scatters forward with SP, Korthikanti et al. 2022
§4.2.2).
"""
from __future__ import annotations

import math

import pytest

import topologies
from autoplan.cost.prices import Prices
from autoplan.cost.tp import BlockLayouts, tp_cost
from autoplan.cost.types import AxisCost, EstimateOptions
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.sharding import BlockSharding, Collective

SPEC = "llama:layers=2,hidden=512,heads=8,kv_heads=8,ffn=1024,vocab=256"
S, H, BF16 = 2048, 512, 2
ACT = S * H * BF16                            # one b·s·h activation, 2 MiB

CLUSTER = topologies.load("h100x64")


@pytest.fixture(scope="module")
def model(traced):
    return traced(SPEC, seq=S)


# ---- the calls under test, one place each (their signatures are being reshaped) -----------------

def _tp(bs: BlockSharding, plan: Plan) -> AxisCost:
    return tp_cost(bs, plan)


def _layout(model, plan: Plan) -> BlockSharding:
    """The block ILP's layout of the dense block under ``plan``, priced without recomputation."""
    layouts = BlockLayouts(Prices(CLUSTER), EstimateOptions(), enforce_rules=False)
    return layouts.sharding("dense0", model.block("dense0").graph, plan, "none", Mesh.of(plan))


# ---- α–β by hand (costmodels/collectives.py) -----------------------------------------------------

C = CLUSTER
B_RING = C.gpu.nvlink_bw * C.nvlink_efficiency                     # 369.9 GB/s
B_NET = C.nics_per_node * C.nic_bw * C.nic_efficiency / C.gpus_per_node    # 47 GB/s: 8 GPUs on 8 NICs
A0, A_NVL, A_RAIL = C.launch_latency, C.nvlink_latency, C.rail_latency
assert not C.sharp and C.num_pods == 1 and C.num_gpus <= C.leaf_size      # one rail group: α_L = rail


def b_nvls(k):
    return C.gpu.nvlink_bw * C.nvls_efficiency * k / (k + 1)


def priced(kind: str, s: float, n: int, m: int = 1) -> float:
    """One collective of nccl-tests size ``s`` over n ranks in m NVLink domains of one rail group."""
    k = n / m
    if kind in ("all_gather", "reduce_scatter"):
        if m == 1:
            return (n - 1) / n * s / B_RING + A0 + (n - 1) * A_NVL
        t = (n - 1) / n * s
        return max(t / B_RING, t / k / B_NET) + A0 + (n - m) * A_NVL + (m - 1) * A_RAIL
    if kind == "all_to_all":
        return max((k - 1) / n * s / B_RING, (n - k) / n * s / B_NET) + A0 + (k - 1) * A_NVL + (m - 1) * A_RAIL
    assert kind == "all_reduce"
    intra = [(2 * (k - 1) / k * s / B_RING, 2 * (k - 1) * A_NVL, "ring"),
             (s / b_nvls(k), 2 * A_NVL, "nvls")] if k > 1 else []
    if m == 1:
        return min(bw + A0 + lat for bw, lat, _ in intra)
    t = 2 * (n - 1) / n * s
    out = [max(t / B_RING, t / k / B_NET) + A0 + (2 * (n - 1) - 2 * m) * A_NVL + 2 * m * A_RAIL]
    for bw_in, lat_in, name in intra or [(0.0, 0.0, "")]:
        inter = [(2 * s / k, 2 * math.ceil(math.log2(m)) * A_RAIL)]
        if name == "nvls":
            inter.append((2 * (m - 1) / m * s / k, 2 * (m - 1) * A_RAIL))
        out += [max(bw_in, e / B_NET) + A0 + lat_in + lat_out for e, lat_out in inter]
    return min(out)


def _by_phase(bs: BlockSharding, n: int, m: int = 1) -> tuple[float, float]:
    """(forward, backward + weight-gradient) seconds of the layout's collectives, priced by hand."""
    fwd = sum(priced(c.kind, c.nbytes, n, m) for c in bs.collectives if c.phase == "forward")
    return fwd, sum(priced(c.kind, c.nbytes, n, m) for c in bs.collectives if c.phase != "forward")


# ---- tp_cost on a hand-built layout -----------------------------------------------------------------

def _sharding(*collectives: Collective) -> BlockSharding:
    return BlockSharding({}, {}, {}, tuple(collectives), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0)


HAND = _sharding(Collective("all_gather", 10.0, "forward", "x", 1e-5),
                 Collective("reduce_scatter", 20.0, "forward", "y", 2e-5),
                 Collective("all_reduce", 30.0, "forward", "z", 4e-5),
                 Collective("all_gather", 40.0, "wgrad", "x", 8e-6),
                 Collective("reduce_scatter", 50.0, "backward", "y", 3e-6),
                 Collective("all_to_all", 60.0, "backward", "q", 5e-6))


def test_every_tp_collective_is_exposed_and_weight_gradients_count_in_backward():
    cost = _tp(HAND, Plan(tp=2))
    assert cost.exposed_fwd_s == pytest.approx(1e-5 + 2e-5 + 4e-5, rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(8e-6 + 3e-6 + 5e-6, rel=1e-12)
    assert [(c.axis, c.kind, c.nbytes, c.phase) for c in cost.comms] == [
        ("tp", "all_gather", 10.0, "forward"), ("tp", "reduce_scatter", 20.0, "forward"),
        ("tp", "all_reduce", 30.0, "forward"), ("tp", "all_gather", 40.0, "backward"),
        ("tp", "reduce_scatter", 50.0, "backward"), ("tp", "all_to_all", 60.0, "backward")]
    assert all(c.seconds == c.exposed_s for c in cost.comms)


def test_gathers_and_scatters_are_sequence_parallelisms_only_with_sp():
    assert [c.purpose for c in _tp(HAND, Plan(tp=2)).comms] == ["sp", "sp", "tp", "sp", "sp", "tp"]
    assert [c.purpose for c in _tp(HAND, Plan(tp=2, sp=False)).comms] == ["tp"] * 6
    assert _tp(_sharding(), Plan(tp=2)) == AxisCost()


# ---- tp_cost on the block ILP's layouts, worked by hand ---------------------------------------------

def test_megatron_tp2_without_sp_two_all_reduces_per_pass(model):
    plan = Plan(tp=2, dp=32, sp=False)
    bs = _layout(model, plan)
    assert sorted((c.kind, c.nbytes, c.phase) for c in bs.collectives) == \
        [("all_reduce", ACT, "backward")] * 2 + [("all_reduce", ACT, "forward")] * 2
    # 2 ranks: ring 2·(1/2)·S/B + 6 µs + 2 µs = 13.67 µs beats NVLS S/(450·0.686·2/3 GB/s) + 8 µs
    ar = 2 * 1 / 2 * ACT / B_RING + A0 + 2 * A_NVL
    assert ar < ACT / b_nvls(2) + A0 + 2 * A_NVL
    cost = _tp(bs, plan)
    assert cost.exposed_fwd_s == pytest.approx(2 * ar, rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(2 * ar, rel=1e-12)
    assert {c.purpose for c in cost.comms} == {"tp"}


def test_megatron_tp2_with_sp_gathers_and_scatters_the_activation_in_forward(model):
    plan = Plan(tp=2, dp=32)
    bs = _layout(model, plan)
    assert sorted((c.kind, c.nbytes) for c in bs.collectives if c.phase == "forward") == \
        [("all_gather", ACT)] * 2 + [("reduce_scatter", ACT)] * 2
    one = 1 / 2 * ACT / B_RING + A0 + A_NVL                # (n−1)/n·S/B + α0 + (n−1)·α_nvl
    cost = _tp(bs, plan)
    assert cost.exposed_fwd_s == pytest.approx(4 * one, rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(_by_phase(bs, 2)[1], rel=1e-12)
    assert {c.purpose for c in cost.comms if c.kind != "all_reduce"} == {"sp"}


def test_tp8_in_a_node_nvls_all_reduces_and_ring_gathers(model):
    plan = Plan(tp=8, dp=8)
    bs = _layout(model, plan)
    cost = _tp(bs, plan)
    fwd, bwd = _by_phase(bs, 8)
    assert (cost.exposed_fwd_s, cost.exposed_bwd_s) == (pytest.approx(fwd, rel=1e-12), pytest.approx(bwd, rel=1e-12))
    assert {c.kind for c in bs.collectives} >= {"all_reduce", "all_gather"}


def test_tp2_across_two_nodes_prices_its_collectives_on_the_network(model):
    plan = Plan(tp=2, dp=32, order=("dp", "tp", "cp", "ep", "pp"))        # tp group {0, 32}
    assert Mesh.of(plan).group("tp") == (0, 32)
    bs = _layout(model, plan)
    cost = _tp(bs, plan)
    fwd, bwd = _by_phase(bs, 2, m=2)
    assert (cost.exposed_fwd_s, cost.exposed_bwd_s) == (pytest.approx(fwd, rel=1e-12), pytest.approx(bwd, rel=1e-12))
    # one 2 MiB gather across nodes: a 1-step flat ring, half of S on a 47 GB/s NIC + α0 + α_rail
    gathers = [c for c in cost.comms if c.kind == "all_gather" and c.nbytes == ACT]
    assert gathers and gathers[0].seconds == pytest.approx(ACT / 2 / B_NET + A0 + A_RAIL, rel=1e-12)
