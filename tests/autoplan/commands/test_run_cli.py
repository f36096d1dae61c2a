"""``autoplan run``: a 4-rank CPU run learns; bad input is one message and exit 2, before any launch."""
from __future__ import annotations

import json
import math
import re

import pytest

from autoplan.cli import main

LLAMA = "llama:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,ffn=128"


def first_failure(stderr: str) -> str:
    """The lines of the rank ``launch`` names as the first to fail (the others' errors follow from it),
    then the end of stderr."""
    named = re.search(r"^rank (\d+) failed first", stderr, flags=re.M)
    own = [ln for ln in stderr.splitlines() if ln.startswith(f"[rank{named.group(1)}]:")] if named else []
    return "\n".join(own)[-4000:] + "\n...\n" + stderr[-2000:]


def plan_for_run() -> str:
    """Hook for a searched plan: replace with the best plan of `autoplan search` for 4 GPUs."""
    return "tp=2,pp=2,sp=on,schedule=1f1b"


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_four_rank_run_prints_decreasing_loss(cli):
    r = cli("run", LLAMA, "--plan", plan_for_run(), "--nproc", "4", "--steps", "4", "--seq", "32",
            "--lr", "3e-3")
    assert r.returncode == 0, first_failure(r.stderr)
    losses = [float(x) for x in re.findall(r"^step \d+/4  loss ([0-9.]+)$", r.stdout, flags=re.M)]
    assert len(losses) == 4, r.stdout
    assert all(a > b for a, b in zip(losses, losses[1:])), losses
    assert "on 4 processes (gloo)" in r.stdout


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_readme_check_example_reports_a_match(cli):
    """The README's `autoplan run gpt:... --plan tp=2,pp=2 --nproc 4 --check` (GPT: dropout 0.1 by default)."""
    r = cli("run", "gpt:layers=4,hidden=64,heads=4,vocab=256", "--plan", "tp=2,pp=2", "--nproc", "4",
            "--steps", "4", "--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    first = float(re.search(r"^step 1/4  loss ([0-9.]+)$", r.stdout, flags=re.M).group(1))
    assert abs(first - math.log(256)) < 0.1                    # a fresh model starts at ≈ ln(vocab)
    assert re.search(r"^  grad wte\.weight +rel err \d\.\d\de-0[6-9]$", r.stdout, flags=re.M), r.stdout
    assert "tolerance 4.58e-05 = 32·ε·(L+2)·√N, fp32 ε = 2^-23, L = 4 blocks, N = 4 ranks" in r.stdout
    assert re.search(r"^OK: max relative error .* <= tolerance 4.58e-05$", r.stdout, flags=re.M)


@pytest.mark.parametrize("args, message", [
    (["--plan", "tp=two"], "tp='two' is not an integer"),
    (["--plan", "tp=2,cp=2", "--nproc", "4", "--seq", "18"], "the sequence length 18 does not divide by 4"),
    (["--plan", "tp=2,dp=1", "--nproc", "4"], "= 2, but the cluster has 4 GPUs"),
    (["--plan", "tp=2", "--nproc", "3"], "does not divide 3 GPUs"),
    (["--plan", "tp=2", "--steps", "0"], "--steps must be at least 1"),
    (["--plan", "tp=2", "--backend", "nccl"], "--backend nccl needs 2 CUDA devices"),
    (["--plan", "tp=2", "--check", "--dtype", "bf16"], "--check compares in fp32"),
])
def test_bad_input_exits_2_with_one_message(capsys, args, message):
    """Checked in the launching process (in-process CLI here: no workers start)."""
    assert main(["run", LLAMA, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and "Traceback" not in err


def test_unknown_model_and_bad_placements_file_exit_2(capsys, tmp_path):
    assert main(["run", "nosuchmodel", "--plan", "tp=2"]) == 2
    assert "unknown model 'nosuchmodel'" in capsys.readouterr().err
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(["S(0)"]))
    assert main(["run", LLAMA, "--plan", "tp=2", "--placements", str(bad)]) == 2
    assert "is not a JSON object of strings" in capsys.readouterr().err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"attention.q_proj.weight": "S(0)"}))
    assert main(["run", LLAMA, "--plan", "tp=2", "--placements", str(partial)]) == 2
    assert "placements do not cover block 0: missing attention_norm.weight" in capsys.readouterr().err


def test_one_subprocess_error_path_prints_no_traceback(cli):
    r = cli("run", LLAMA, "--plan", "cp=2", "--nproc", "2", "--seq", "6")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "does not divide by 4" in r.stderr
    assert "Traceback" not in r.stderr


def test_valid_placements_pass_the_launch_checks(tmp_path):
    from autoplan.cli import build_parser
    from autoplan.commands.run import _checked_config

    names = ["attention_norm.weight", "ffn_norm.weight", "attention.q_proj.weight", "attention.k_proj.weight",
             "attention.v_proj.weight", "attention.o_proj.weight", "feed_forward.gate_proj.weight",
             "feed_forward.up_proj.weight", "feed_forward.down_proj.weight"]
    f = tmp_path / "p.json"
    f.write_text(json.dumps({n: ("S(1)" if n.endswith(("o_proj.weight", "down_proj.weight")) else
                                 "R" if "norm" in n else "S(0)") for n in names}))
    args = build_parser().parse_args(["run", LLAMA, "--plan", "tp=2", "--placements", str(f)])
    cfg, nproc = _checked_config(args)
    assert nproc == 2 and cfg.placements["attention.o_proj.weight"] == "S(1)"
