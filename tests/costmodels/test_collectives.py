"""The collective cost model against nccl-tests identities and published NCCL measurements
(calibration_runs.md §6c).  Sizes are large (1 GiB) where a bandwidth figure is checked."""
import dataclasses

import pytest

import topologies
from costmodels.collectives import KINDS, alg_bandwidth, bus_bandwidth, bus_factor, collective_cost, collective_time

GB = 1e9
BIG = 1 << 30


@pytest.fixture(scope="module")
def h100():
    return topologies.load("h100x1024")


@pytest.fixture(scope="module")
def selene():
    return topologies.load("selene")


def busbw(cluster, ranks, kind="all_reduce", nbytes=BIG, **kw):
    return collective_cost(kind, nbytes, cluster.span(ranks), cluster, **kw).busbw / GB


# ----- nccl-tests identities -------------------------------------------------------------------

def test_bus_factors():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(kind, 8) == pytest.approx(7 / 8)
    assert bus_factor("p2p", 2) == bus_factor("broadcast", 16) == 1.0
    assert alg_bandwidth(1e9, 0.01) == pytest.approx(100e9)
    assert bus_bandwidth("all_reduce", 1e9, 8, 0.01) == pytest.approx(175e9)
    with pytest.raises(ValueError, match="unknown collective kind"):
        bus_factor("allreduce", 8)


def test_cost_fields_are_consistent(h100):
    span = h100.span(range(16))
    for kind in KINDS:
        cost = collective_cost(kind, BIG, span, h100)
        assert cost.time_s == collective_time(kind, BIG, span, h100)
        assert cost.algbw == pytest.approx(BIG / cost.time_s)
        assert cost.busbw == pytest.approx(bus_bandwidth(kind, BIG, 16, cost.time_s))
        assert 0 < cost.latency_s < cost.time_s
        assert (cost.level, cost.link, cost.group_size) == ("rail", "IB rail", 16)


def test_trivial_collectives_are_free(h100):
    assert collective_time("all_reduce", BIG, h100.span([5]), h100) == 0.0
    assert collective_time("all_gather", 0, h100.span(range(8)), h100) == 0.0


# ----- inside one NVLink domain ----------------------------------------------------------------

def test_eight_h100_in_a_node(h100):
    # ring-type collectives: ~370 GB/s busbw (nccl-tests#212); all-reduce uses NVLS: ~480
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw(h100, range(8), kind) == pytest.approx(370, rel=0.03)
    cost = collective_cost("all_reduce", BIG, h100.span(range(8)), h100)
    assert cost.algorithm == "nvls" and cost.level == "nvlink" and cost.link == "NVLink"
    assert cost.busbw / GB == pytest.approx(480, rel=0.03)
    no_nvls = dataclasses.replace(h100, nvls=False)
    assert busbw(no_nvls, range(8)) == pytest.approx(370, rel=0.03)


@pytest.mark.parametrize("cluster, measured", [("h800x64", 215), ("h200x64", 475)])
def test_published_intra_node_all_reduce(cluster, measured):
    c = topologies.load(cluster)
    assert busbw(c, range(8)) == pytest.approx(measured, rel=0.10)


def test_nvls_only_pays_off_for_larger_groups(h100):
    assert collective_cost("all_reduce", BIG, h100.span([0, 1]), h100).algorithm == "ring"
    assert collective_cost("all_reduce", BIG, h100.span(range(8)), h100).algorithm == "nvls"


def test_p2p_nvlink_vs_network(h100):
    assert busbw(h100, [0, 1], "p2p") == pytest.approx(370, rel=0.03)  # nccl#1264: 380
    assert busbw(h100, [0, 8], "p2p") == pytest.approx(47, rel=0.03)   # one NDR NIC


# ----- across nodes ----------------------------------------------------------------------------

def test_same_eight_ranks_over_two_nodes_go_over_the_nics(h100):
    inside, split = h100.span(range(8)), h100.span([0, 1, 2, 3, 8, 9, 10, 11])
    for kind, slower in (("all_reduce", 1.3), ("all_to_all", 3.0), ("all_gather", 1.05),
                         ("reduce_scatter", 1.05), ("broadcast", 1.5)):
        a, b = collective_cost(kind, BIG, inside, h100), collective_cost(kind, BIG, split, h100)
        assert b.level == "rail" and b.bottleneck == "NIC", kind
        assert b.time_s > slower * a.time_s, kind


def test_one_gpu_per_node_gets_one_nic(h100):
    # DP group when TP=8 fills the node: every GPU of the node drives its own 400G NIC
    dp = range(0, 64, 8)
    assert busbw(h100, dp) == pytest.approx(47, rel=0.05)  # nccl-tests#290: 46-48 GB/s per NIC
    assert busbw(h100, dp, "all_gather") == pytest.approx(47, rel=0.05)
    assert busbw(h100, range(0, 64, 8), concurrent_groups_per_node=1) == pytest.approx(47, rel=0.05)


@pytest.mark.parametrize("nodes", [16, 128])
def test_h100_multi_node_all_reduce_reaches_the_nic_aggregate(h100, nodes):
    # nccl-tests#309: peak ~400 GB/s busbw with 8x 400G NICs per node
    assert busbw(h100, range(8 * nodes)) == pytest.approx(400, rel=0.10)


@pytest.mark.parametrize("nodes", [16, 64])
def test_selene_multi_node_all_reduce(selene, nodes):
    # nccl#812: 192 GB/s busbw on DGX-A100 with 8x HDR 200G
    assert busbw(selene, range(8 * nodes)) == pytest.approx(192, rel=0.10)


def test_nic_sharing(tmp_path):
    path = tmp_path / "four_nics.yaml"
    path.write_text("gpu: h100\nnum_gpus: 64\nnics_per_node: 4\n")
    c = topologies.load(str(path))
    dp = range(0, 64, 8)
    # all 8 GPUs of a node on the network share 4 NICs: half a NIC each
    assert busbw(c, dp) == pytest.approx(23.5, rel=0.05)
    # a lone group gets a whole NIC
    assert busbw(c, dp, concurrent_groups_per_node=1) == pytest.approx(47, rel=0.05)
    with pytest.raises(ValueError, match="concurrent_groups_per_node"):
        busbw(c, dp, concurrent_groups_per_node=0)


def test_sharp_speeds_up_multi_node_all_reduce(h100):
    sharp = dataclasses.replace(h100, sharp=True)
    dp = range(0, 1024, 8)
    plain, reduced = (collective_cost("all_reduce", BIG, c.span(dp), c) for c in (h100, sharp))
    assert "sharp" in reduced.algorithm
    assert reduced.time_s == pytest.approx(plain.time_s / 2, rel=0.05)


def test_nvl72_keeps_a_72_gpu_group_on_nvlink():
    c = topologies.load("gb200x576")
    rack = collective_cost("all_gather", BIG, c.span(range(72)), c)
    assert rack.level == "nvlink" and rack.bottleneck == "NVLink"
    assert rack.busbw / GB == pytest.approx(0.822 * 900, rel=0.06)  # 71 ring steps of latency
    # two racks: the cross-rack phase carries S/72 per GPU, so NVLink stays the bottleneck
    two = collective_cost("all_gather", BIG, c.span(range(144)), c)
    assert two.level == "rail" and two.bottleneck == "NVLink"


# ----- oversubscription ------------------------------------------------------------------------

def test_cross_pod_group_is_slower_than_inside_a_pod():
    c = topologies.load("h100x16384")
    inside = collective_cost("all_reduce", BIG, c.span(range(16)), c)
    across = collective_cost("all_reduce", BIG, c.span([*range(8), *range(3072, 3080)]), c)
    assert across.level == "pod" and across.bottleneck == "pod uplink"
    assert across.link == "across pods (1:7)"
    assert across.time_s > 3 * inside.time_s
    a2a_in = collective_time("all_to_all", BIG, c.span(range(0, 64, 8)), c)
    a2a_out = collective_time("all_to_all", BIG, c.span(range(0, 3072 * 4, 3072 // 2)), c)
    assert a2a_out > 3 * a2a_in
    # without oversubscription the same group costs what it costs inside a pod, bar latency
    flat = dataclasses.replace(c, pod_oversubscription=1.0)
    across_flat = collective_cost("all_reduce", BIG, flat.span([*range(8), *range(3072, 3080)]), flat)
    assert across_flat.time_s == pytest.approx(inside.time_s, rel=0.01)


def test_rings_with_many_nodes_per_pod_tolerate_oversubscription():
    # DP over all 16,384 GPUs with TP=8 x PP=16 inside: 128 ranks, ~21 nodes in each pod > 7
    c = topologies.load("h100x16384")
    dp = collective_cost("all_reduce", BIG, c.span(range(0, 16384, 128)), c)
    assert dp.level == "pod" and dp.bottleneck == "NIC"
    assert dp.busbw / GB == pytest.approx(47, rel=0.05)


# ----- latency ---------------------------------------------------------------------------------

def test_latency_dominates_tiny_messages(h100):
    for ranks in (range(8), range(64), range(1024)):
        cost = collective_cost("all_reduce", 8, h100.span(ranks), h100)
        assert cost.latency_s > 0.99 * cost.time_s
        assert h100.launch_latency < cost.time_s < 1e-3
    small = collective_time("all_gather", 8, h100.span(range(64)), h100)
    large = collective_time("all_gather", 8, h100.span(range(1024)), h100)
    assert large > 5 * small  # ring all-gather: one step per node
    # a big group's all-reduce uses the tree (log steps) for tiny messages, the ring for big ones
    assert collective_cost("all_reduce", 8, h100.span(range(1024)), h100).algorithm.endswith("tree")
    assert collective_cost("all_reduce", BIG, h100.span(range(64)), h100).algorithm.endswith("ring")


def test_time_grows_with_size(h100):
    span = h100.span([0, 1, 2, 3, 8, 9, 10, 11])
    for kind in KINDS:
        times = [collective_time(kind, s, span, h100) for s in (1 << 10, 1 << 20, 1 << 30)]
        assert times == sorted(times) and times[0] < times[-1], kind


def test_two_nodes_without_nvls_run_nccls_flat_ring_not_a_hierarchy(selene):
    """tp=16 over two A100 nodes: NCCL's ring crosses the nodes with 2(n-1)/n·S/k per NIC
    (1.875x the 2(m-1)/m·S/k a ring-in-node + ring-across hierarchy would move)."""
    cost = collective_cost("all_reduce", BIG, selene.span(range(16)), selene)
    assert cost.algorithm == "ring" and cost.bottleneck == "NIC"
    per_gpu = selene.node_network_bw / selene.gpus_per_node
    assert cost.time_s - cost.latency_s == pytest.approx(2 * 15 / 16 * BIG / 8 / per_gpu, rel=1e-9)
    rs = collective_cost("reduce_scatter", BIG, selene.span(range(16)), selene)
    assert rs.time_s - rs.latency_s == pytest.approx(15 / 16 * BIG / 8 / per_gpu, rel=1e-9)
    # NCCL's tuning model: 2m network steps of the ring, the rest on NVLink
    assert cost.latency_s == pytest.approx(selene.launch_latency + (30 - 4) * selene.nvlink_latency
                                           + 4 * selene.rail_latency)


def test_small_messages_across_many_nodes_take_the_tree(selene):
    cost = collective_cost("all_reduce", 64 << 10, selene.span(range(0, 8 * 64, 8)), selene)
    assert cost.algorithm == "tree"
