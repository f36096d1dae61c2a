"""``autoplan calibrate`` through the CLI.  No GPU here: measuring fails cleanly; refitting works."""
import json
import os

import pytest
import yaml

from costmodels.compute import load_profile

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "synthetic_h100.yaml")


@pytest.fixture
def no_gpu(monkeypatch):
    """Hide any GPU from the subprocess, so the test means the same on a GPU machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_without_a_gpu_it_says_so(cli, no_gpu):
    for args in ((), ("--quick", "--gpu", "h100")):
        proc = cli("calibrate", *args)
        assert proc.returncode == 2, proc.stderr
        assert "no CUDA GPU found: autoplan calibrate measures the local GPU" in proc.stderr
        assert "shipped profiles in costmodels/profiles come from published figures" in proc.stderr
        assert "--from PATH" in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_bad_arguments_fail_before_measuring(cli, no_gpu, tmp_path):
    proc = cli("calibrate", "--gpu", "h1000")
    assert proc.returncode == 2 and "unknown GPU kind 'h1000'" in proc.stderr and "h100" in proc.stderr
    proc = cli("calibrate", "--out", str(tmp_path / "missing" / "p.yaml"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = cli("calibrate", "--out", str(tmp_path / "p.json"))
    assert proc.returncode == 2 and "does not end in .yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_refit_from_stored_measurements_writes_a_loadable_profile(cli, tmp_path):
    out = tmp_path / "h100-synthetic.yaml"
    proc = cli("calibrate", "--from", SAMPLE, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert proc.stdout.strip() == json.dumps(summary, indent=2, sort_keys=True)
    assert (summary["gpu"], summary["out"], summary["gemm_samples"]) == ("h100", str(out), 845)
    profile = load_profile("h100", str(out))
    assert profile.name == "h100-synthetic" and summary["profile"]["gemm_half_dim"] == profile.gemm_half_dim
    assert abs(profile.gemm_peak_fraction - 0.78) < 0.02 and abs(profile.memory_fraction - 0.88) < 0.02
    assert profile.fusion == load_profile("h100").fusion
    assert "SYNTHETIC" in profile.source
    written = yaml.safe_load(out.read_text())
    assert written["gpu"] == "h100" and len(written["measurements"]["gemm"]["rows"]) == 845
    # refitting the written profile gives the same file, byte for byte
    again = tmp_path / "h100-synthetic-again.yaml"
    proc = cli("calibrate", "--from", str(out), "--out", str(again))
    assert proc.returncode == 0, proc.stderr
    assert "gemm_peak_fraction" in proc.stdout and f"--profile {again}" in proc.stdout
    assert again.read_text().replace("h100-synthetic-again", "h100-synthetic") == out.read_text()


def test_unusable_measurement_files_are_user_errors(cli, tmp_path):
    shipped = os.path.join("costmodels", "profiles", "h100.yaml")
    proc = cli("calibrate", "--from", shipped, "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and "has no 'measurements'" in proc.stderr
    broken = tmp_path / "broken.yaml"
    data = yaml.safe_load(open(SAMPLE))
    data["measurements"]["gemm"]["rows"][3][3] = 0
    del data["gpu"]
    broken.write_text(yaml.safe_dump(data))
    proc = cli("calibrate", "--from", str(broken), "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and "gemm' row 3: seconds must be a positive number" in proc.stderr
    data["measurements"]["gemm"]["rows"][3][3] = 1e-5
    broken.write_text(yaml.safe_dump(data))
    proc = cli("calibrate", "--from", str(broken), "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and "does not say which GPU kind" in proc.stderr and "--gpu" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_fit_failures_are_user_errors(cli, tmp_path):
    data = yaml.safe_load(open(SAMPLE))
    data["measurements"]["tiny"]["rows"] = []
    path = tmp_path / "no-tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = cli("calibrate", "--from", str(path), "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and "cannot fit a profile: measurements have no tiny kernels" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unrecognised_gpu_needs_gpu_flag(monkeypatch, capsys):
    """A GPU whose name is not a known SXM part (in-process: no GPU here to run the CLI on)."""
    from autoplan import cli
    from autoplan.commands import calibrate

    monkeypatch.setattr(calibrate, "cuda_device_name", lambda: "NVIDIA H100 PCIe")
    assert cli.main(["calibrate", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which catalog GPU kind 'NVIDIA H100 PCIe' is" in err and "pass --gpu" in err
