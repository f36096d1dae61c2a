import pytest
import yaml

import topologies
from topologies import TopologyError


@pytest.mark.parametrize("name", ["selene", "h100x16384", "gb200-nvl72", "gb200x576", "h800x64"])
def test_round_trip(name, tmp_path):
    cluster = topologies.load(name)
    text = topologies.dump_yaml(cluster)
    assert topologies.from_mapping(yaml.safe_load(text), default_name="x", source="t") == cluster
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    assert topologies.load(str(path)) == cluster


def test_minimal_user_file_takes_defaults(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("gpu: h100\nnum_gpus: 64\npod_oversubscription: 2\n")
    c = topologies.load(str(path))
    assert c.name == "lab" and "8 nodes" in c.description
    assert (c.gpus_per_node, c.nics_per_node, c.nic, c.nic_bw, c.nic_efficiency) == \
        (8, 8, "ndr400", 50e9, 0.94)
    assert (c.nvlink_efficiency, c.nvls_efficiency, c.rail_latency) == (0.822, 0.686, 5e-6)
    assert c.pod_oversubscription == 2.0 and isinstance(c.pod_oversubscription, float)


def test_custom_nic(tmp_path):
    path = tmp_path / "eth.yaml"
    path.write_text("gpu: a100\nnum_gpus: 16\nnic: cx6-100g\nnic_bw: 12.5e9\nnic_efficiency: 0.9\n")
    c = topologies.load(str(path))
    assert (c.nic, c.nic_bw, c.nic_efficiency) == ("cx6-100g", 12.5e9, 0.9)


@pytest.mark.parametrize("text, message", [
    ("gpu: h100\nnum_gpus: 64\nnvlink_domian: 8\n", "unknown key(s) nvlink_domian"),
    ("gpu: h100\n", "missing required key 'num_gpus'"),
    ("gpu: h100\nnum_gpus: '64'\n", "num_gpus must be a positive integer"),
    ("gpu: h100\nnum_gpus: 12\n", "multiple of nvlink_domain"),
    ("gpu: h100\nnum_gpus: 64\nnvls: maybe\n", "nvls must be true or false"),
    ("gpu: h100\nnum_gpus: 64\nnic: ib9000\n", "unknown nic kind 'ib9000'"),
    ("gpu: h100\nnum_gpus: 64\npod_size: 100\n", "pod_size (100) must be a multiple"),
    ("gpu: tpu\nnum_gpus: 64\n", "unknown GPU kind 'tpu'"),
    ("- gpu: h100\n", "must be a YAML mapping"),
    ("gpu: [h100\n", "not valid YAML"),
])
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError) as err:
        topologies.load(str(path))
    assert message in str(err.value)


def test_unknown_key_message_lists_allowed_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("gpu: h100\nnum_gpus: 64\ncolour: red\n")
    with pytest.raises(TopologyError) as err:
        topologies.load(str(path))
    assert "nvlink_domain" in err.value.fix and "pod_oversubscription" in err.value.fix


def test_missing_file():
    with pytest.raises(TopologyError, match="not found"):
        topologies.load("no/such/cluster.yaml")


def test_bundled_files_are_named_after_themselves():
    for cluster in topologies.named_clusters():
        assert topologies.load(cluster.name) == cluster
        assert cluster.description


def test_gpu_overrides_apply_and_round_trip():
    from topologies.cluster_yaml import from_mapping, to_mapping
    raw = {"gpu": "h100", "num_gpus": 8, "gpu_hbm_bytes": 96e9, "gpu_hbm_bw": "2.4e12", "gpu_bf16_flops": 800e12}
    c = from_mapping(raw, default_name="gt", source="gt.yaml")
    assert (c.gpu.name, c.gpu.hbm_bytes, c.gpu.hbm_bw, c.gpu.bf16_flops) == ("h100", 96e9, 2.4e12, 800e12)
    m = to_mapping(c)
    assert m["gpu_hbm_bytes"] == 96e9 and from_mapping(m, default_name="gt", source="gt.yaml") == c
    plain = to_mapping(from_mapping({"gpu": "h100", "num_gpus": 8}, default_name="p", source="p.yaml"))
    assert "gpu_hbm_bytes" not in plain


def test_gpu_override_must_be_positive():
    import pytest

    from topologies.cluster_yaml import from_mapping
    from topologies.errors import TopologyError
    with pytest.raises(TopologyError, match="gpu_hbm_bw must be a finite number > 0"):
        from_mapping({"gpu": "h100", "num_gpus": 8, "gpu_hbm_bw": 0}, default_name="x", source="x.yaml")


def test_gpu_nvlink_bw_caps_an_a800s_nvlink_and_prices_its_ring():
    """A800 SXM: A100 silicon with 8 of its 12 NVLink links, 400 GB/s bidirectional = 200 GB/s a
    direction (A100: 300).  The key sets it; a ring all-reduce inside the node pays 1/bw of it."""
    import topologies
    from costmodels.collectives import collective_time
    from topologies.cluster_yaml import dump_yaml, from_mapping, to_mapping
    a800 = from_mapping({"gpu": "a100", "num_gpus": 16, "gpu_nvlink_bw": 200e9}, default_name="a800x16",
                        source="a800.yaml")
    a100 = topologies.load("a100x16")
    assert (a100.gpu.nvlink_bw, a800.gpu.nvlink_bw) == (300e9, 200e9)
    assert a800.gpu.bf16_flops == a100.gpu.bf16_flops and a800.nics_per_node == a100.nics_per_node
    assert to_mapping(a800)["gpu_nvlink_bw"] == 200e9 and "gpu_nvlink_bw" not in to_mapping(a100)
    assert "gpu_nvlink_bw: 200000000000.0" in dump_yaml(a800)
    # bandwidth term of a 1 GB 8-GPU ring all-reduce: 2·7/8·S / (bw·eff); the α terms are the same
    nbytes, ranks = 1e9, tuple(range(8))
    t800 = collective_time("all_reduce", nbytes, a800.span(ranks), a800)
    t100 = collective_time("all_reduce", nbytes, a100.span(ranks), a100)
    eff = a100.nvlink_efficiency
    assert t800 - t100 == pytest.approx(2 * 7 / 8 * nbytes * (1 / (200e9 * eff) - 1 / (300e9 * eff)), rel=1e-6)
