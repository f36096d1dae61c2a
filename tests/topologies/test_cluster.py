import dataclasses

import pytest

import topologies


@pytest.fixture(scope="module")
def h100():
    return topologies.load("h100x1024")


def test_rank_layout_levels(h100):
    inside = h100.span(range(8))
    assert (inside.level, inside.nodes, inside.gpus_per_node, inside.domains) == ("nvlink", 1, 8, 1)
    split = h100.span([0, 1, 2, 3, 8, 9, 10, 11])
    assert (split.level, split.nodes, split.gpus_per_node, split.domains, split.leaves) == \
        ("rail", 2, 4, 2, 1)
    # a rail group is 32 nodes = 256 GPUs, a pod 1024 GPUs (the whole cluster)
    assert h100.span([0, 255]).level == "rail"
    across_leaves = h100.span([0, 256])
    assert (across_leaves.level, across_leaves.leaves, across_leaves.pods) == ("spine", 2, 1)
    dp = h100.span(range(0, 1024, 8))
    assert (dp.size, dp.nodes, dp.gpus_per_node, dp.leaves) == (128, 128, 1, 4)


def test_pods_on_the_llama3_like_cluster():
    c = topologies.load("h100x16384")
    span = c.span([0, 3072])
    assert (span.level, span.pods, span.gpus_per_pod) == ("pod", 2, 1)
    assert c.describe_span(span) == "across pods (1:7)"
    assert c.describe_span(c.span([0, 8])) == "RoCE rail"  # same rack (2 nodes per ToR)
    assert c.describe_span(c.span([0, 16])) == "RoCE spine"
    assert c.num_pods == 6  # 16,384 = 5 full pods of 3,072 + a partial one


def test_nvl72_domain_spans_trays():
    c = topologies.load("gb200x576")
    rack = c.span(range(72))
    assert (rack.level, rack.nodes, rack.gpus_per_node, rack.domains) == ("nvlink", 18, 4, 1)
    assert c.describe_span(rack) == "NVLink (72-GPU domain)"
    two = c.span(range(144))
    assert (two.level, two.domains, two.gpus_per_domain) == ("rail", 2, 72)


def test_describe_span_texts(h100):
    assert h100.describe_span(h100.span(range(8))) == "NVLink"
    assert h100.describe_span(h100.span([0, 8])) == "IB rail"
    assert h100.describe_span(h100.span([0, 256])) == "IB spine"
    selene = topologies.load("selene")
    assert selene.describe_span(selene.span([0, 1120])) == "across pods (non-blocking)"


@pytest.mark.parametrize("ranks, message", [([], "at least one"), ([0, 0], "duplicate"),
                                            ([0, 1024], "outside")])
def test_bad_groups(h100, ranks, message):
    with pytest.raises(ValueError, match=message):
        h100.span(ranks)


def test_derived_sizes():
    selene = topologies.load("selene")
    assert (selene.num_nodes, selene.num_domains, selene.num_pods, selene.leaf_size) == \
        (560, 560, 4, 160)
    assert selene.num_gpus >= 3072  # the largest Megatron SC'21 run
    assert selene.node_network_bw == pytest.approx(8 * 24e9)
    assert selene.peak_bf16_flops == pytest.approx(4480 * 312e12)


def test_inconsistent_layout_is_rejected(h100):
    with pytest.raises(ValueError, match="multiple of nvlink_domain"):
        dataclasses.replace(h100, num_gpus=1020)
    with pytest.raises(ValueError, match="pod_oversubscription"):
        dataclasses.replace(h100, pod_oversubscription=0.5)
