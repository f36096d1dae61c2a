"""``autoplan clusters`` through the CLI (the command lives in autoplan/commands/clusters.py)."""
import json

import yaml

import topologies


def test_json_lists_the_named_clusters(cli):
    proc = cli("clusters", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["name"] for r in rows] == topologies.named_cluster_names()
    assert proc.stdout.strip() == json.dumps(rows, indent=2, sort_keys=True)
    selene = next(r for r in rows if r["name"] == "selene")
    assert (selene["gpus"], selene["gpu"], selene["nodes"], selene["nics_per_node"]) == \
        (4480, "a100-80gb", 560, 8)
    assert selene["peak_bf16_pflop_s"] == round(4480 * 312e12 / 1e15, 3)
    llama = next(r for r in rows if r["name"] == "h100x16384")
    assert (llama["pod_size"], llama["pod_oversubscription"]) == (3072, 7.0)


def test_table_and_one_cluster(cli):
    proc = cli("clusters")
    assert proc.returncode == 0 and "selene" in proc.stdout and "gb200-nvl72" in proc.stdout
    proc = cli("clusters", "gb200x576", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert (info["nvlink_domain"], info["gpus_per_node"], info["domains"]) == (72, 4, 8)
    proc = cli("clusters", "gb200x576")
    assert proc.returncode == 0 and "576 = 144 nodes x 4" in proc.stdout


def test_yaml_output_reads_back(cli):
    proc = cli("clusters", "h100x16384", "--yaml")
    assert proc.returncode == 0, proc.stderr
    back = topologies.from_mapping(yaml.safe_load(proc.stdout), default_name="x", source="stdout")
    assert back == topologies.load("h100x16384")


def test_unknown_cluster_is_a_user_error(cli):
    proc = cli("clusters", "selenee")
    assert proc.returncode == 2
    assert "unknown cluster 'selenee'" in proc.stderr and "<gpu>x<N>" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_shorthand_and_bad_file_are_user_errors(cli, tmp_path):
    proc = cli("clusters", "h100x12")
    assert proc.returncode == 2 and "multiple of 8" in proc.stderr
    path = tmp_path / "mine.yaml"
    path.write_text("gpu: h100\nnum_gpus: 64\nrails: 8\n")
    proc = cli("clusters", str(path))
    assert proc.returncode == 2 and "unknown key(s) rails" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_yaml_needs_a_cluster(cli):
    proc = cli("clusters", "--yaml")
    assert proc.returncode == 2 and "--yaml shows one cluster" in proc.stderr
