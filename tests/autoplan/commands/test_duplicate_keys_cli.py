"""Every YAML and JSON file the CLI reads refuses a key given twice (YAML and JSON keep the last
silently): ``error:`` naming the key, ``fix:``, exit 2, through the real commands."""
from __future__ import annotations

import json

import pytest

MODEL = "llama:layers=2,hidden=64,heads=2,vocab=256"
CLUSTER = """name: dup
gpu: h100
gpus_per_node: 8
num_gpus: 16
num_gpus: 32
"""


def _refused(out, key: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "error:" in out.stderr and "fix: keep one of them" in out.stderr, out.stderr
    assert f"key '{key}' given twice" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_cluster_file_with_a_key_twice_is_refused(cli, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(CLUSTER)
    out = cli("estimate", MODEL, "--cluster", str(path), "--plan", "dp=16", "--seq", "64", "--global-batch", "16")
    _refused(out, "num_gpus")
    assert "line 5" in out.stderr
    nested = tmp_path / "nested.yaml"        # one level down, in a nested mapping, too
    nested.write_text("gpu: h100\nnum_gpus: 16\nnic:\n  kind: ndr400\n  kind: ndr200\n")
    _refused(cli("clusters", str(nested)), "kind")


def test_the_same_key_in_two_mappings_is_not_a_duplicate(cli, tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: ok\ngpu: h100\ngpus_per_node: 8\nnum_gpus: 16\n")
    out = cli("estimate", MODEL, "--cluster", str(path), "--plan", "dp=16", "--seq", "64", "--global-batch", "16",
              "--json")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("text, key", [
    ('{"schema_version": 2, "plan": {"tp": 2, "tp": 4, "dp": 4}}', "tp"),
    ('{"schema_version": 2, "schema_version": 2, "plan": {"tp": 2}}', "schema_version"),
    ('[{"plan": "tp=2", "plan": "tp=4"}]', "plan"),
])
def test_a_plan_file_with_a_key_twice_is_refused(cli, tmp_path, text, key):
    path = tmp_path / "plan.json"
    path.write_text(text)
    _refused(cli("export", str(path), "--to", "megatron"), key)
    _refused(cli("estimate", MODEL, "--cluster", "h100x8", "--plan", str(path), "--seq", "64",
                 "--global-batch", "16"), key)


def test_params_and_profile_files_with_a_key_twice_are_refused(cli, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("nic_efficiency: 0.8\nnic_efficiency: 0.9\n")
    base = ("estimate", MODEL, "--cluster", "h100x8", "--plan", "dp=8", "--seq", "64", "--global-batch", "16")
    _refused(cli(*base, "--params", str(params)), "nic_efficiency")
    profile = tmp_path / "profile.yaml"
    profile.write_text("memory_fraction: 0.8\nmemory_fraction: 0.7\n")
    _refused(cli(*base, "--profile", str(profile)), "memory_fraction")


def test_json_duplicates_in_a_placements_file_are_refused(tmp_path):
    from autoplan.commands.run import _placements
    from autoplan.errors import UserError

    path = tmp_path / "placements.json"
    path.write_text(json.dumps({"w": "R"})[:-1] + ', "w": "S(0)"}')
    with pytest.raises(UserError, match="key 'w' given twice"):
        _placements(str(path))
