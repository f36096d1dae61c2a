import dataclasses

import pytest

import topologies
from topologies import TopologyError


def test_shorthand_h100():
    c = topologies.load("h100x1024")
    assert (c.gpu.name, c.num_nodes, c.gpus_per_node, c.nvlink_domain) == ("h100", 128, 8, 8)
    assert (c.nics_per_node, c.nic_bw, c.pod_oversubscription, c.nvls) == (8, 50e9, 1.0, True)


def test_shorthand_a100_is_dgx_a100_hdr():
    c = topologies.load("a100x3072")
    assert (c.gpu.name, c.num_nodes, c.nic, c.nic_bw, c.nvls) == ("a100-80gb", 384, "hdr200", 25e9,
                                                                  False)
    assert topologies.load("A100-40GBx64").gpu.name == "a100-40gb"


def test_shorthand_gb200_racks():
    c = topologies.load("gb200x576")
    assert (c.gpus_per_node, c.nvlink_domain, c.nics_per_node) == (4, 72, 4)
    assert (c.num_nodes, c.num_domains) == (144, 8)
    assert topologies.load("gb200x2304").num_domains == 32
    assert topologies.load("h800x16").gpu.nvlink_bw == 200e9
    assert topologies.load("b200x64").gpu.name == "b200"


@pytest.mark.parametrize("name, racks, share", [("gb200x256", 4, 64), ("gb300x256", 4, 64), ("gb200x100", 5, 20),
                                                ("gb200x144", 2, 72)])
def test_nvl72_jobs_use_an_equal_share_of_whole_trays_of_the_fewest_racks(name, racks, share):
    """Published GB200 runs use 256 GPUs as 64 per rack over 4 racks (16 of 18 trays each): the
    job's NVLink domain is its share of a rack; 100 GPUs do not split into 2, 3 or 4 racks of
    whole 4-GPU trays, so 5 racks of 20."""
    c = topologies.load(name)
    assert (c.nvlink_domain, c.num_domains, c.gpus_per_node) == (share, racks, 4)
    assert c.num_gpus == racks * share


@pytest.mark.parametrize("name, message", [("h100x12", "multiple of 8"),
                                           ("gb200x250", "multiple of 72"),   # no equal share of trays
                                           ("h100x0", "multiple of 8"),
                                           ("v100x8", "unknown GPU kind")])
def test_shorthand_errors(name, message):
    with pytest.raises(TopologyError) as err:
        topologies.load(name)
    assert message in str(err.value)


def test_unknown_name_lists_names_and_grammar():
    with pytest.raises(TopologyError) as err:
        topologies.load("selenee")
    text = str(err.value)
    assert "unknown cluster 'selenee'" in text
    for name in ("selene", "h100x1024", "h100x16384", "gb200-nvl72"):
        assert name in text
    assert "<gpu>x<N>" in text and "gb200x576" in text and "YAML" in text


def test_named_clusters():
    clusters = topologies.named_clusters()
    names = [c.name for c in clusters]
    assert names == sorted(names) == topologies.named_cluster_names()
    assert {"h100x1024", "selene", "h100x16384", "gb200-nvl72"} <= set(names)
    llama = topologies.load("h100x16384")
    assert (llama.num_gpus, llama.pod_size, llama.pod_oversubscription) == (16384, 3072, 7.0)
    rack = topologies.load("gb200-nvl72")
    assert (rack.num_gpus, rack.num_domains, rack.num_nodes) == (72, 1, 18)


def test_named_h100x1024_is_the_shorthand():
    named = topologies.load("h100x1024")
    short = topologies.shorthand("h100", 1024)
    assert dataclasses.replace(named, description=short.description) == short
