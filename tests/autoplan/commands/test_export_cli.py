"""``autoplan export`` through the CLI: outputs, warnings on stderr, exit 2 on bad input."""
from __future__ import annotations

import json
import shlex

import pytest
import tomllib

from autoplan.cli import main
from autoplan.plan import Plan

GPT3 = "tp=8,pp=8,dp=16,vpp=3,schedule=interleaved,recompute=selective,sp=on,zero=1"


def test_torchtitan_prints_its_0_3_command_line_and_warns_on_stderr(capsys):
    assert main(["export", GPT3, "--to", "torchtitan", "--model", "gpt3-175b", "--global-batch", "1536",
                 "--seq", "2048"]) == 0
    out, err = capsys.readouterr()
    argv = shlex.split(" ".join(line.rstrip("\\") for line in out.splitlines() if not line.startswith("#")))
    assert argv[:4] == ["--module", "llama3", "--config", "llama3_debugmodel"]
    assert argv[-1] == "activation_checkpoint:selective"
    parts = argv[argv.index("--parallelism.module_fqns_per_model_part") + 1:][:24]
    assert len(parts) == 24 and all(p.count("layers.") == 4 for p in parts)
    lines = err.splitlines()
    assert lines[0].startswith("warning: torchtitan cannot express the plan exactly: torchtitan 0.3.0 ships no config "
                               "for gpt3-175b: --module llama3 --config llama3_debugmodel stand in")
    assert any("zero=1 has no torchtitan form" in line for line in lines)
    assert any("recompute=selective (Megatron's attention-core recomputation)" in line for line in lines)


def test_torchtitan_output_file_holds_one_argument_per_line(capsys, tmp_path):
    target = tmp_path / "args.txt"
    assert main(["export", "tp=2,pp=2,dp=2,zero=3", "--to", "torchtitan", "--model", "llama3-8b",
                 "-o", str(target)]) == 0
    lines = target.read_text().splitlines()
    assert lines[:4] == ["--module", "llama3", "--config", "llama3_8b"]
    assert lines[lines.index("--parallelism.tensor_parallel_degree") + 1] == "2"
    assert "--training.disable_cuda_graphs" in lines and lines[-1] == "activation_checkpoint:none"
    assert capsys.readouterr().out == ""


def test_torchtitan_0_2_toml_behind_its_own_target(capsys):
    assert main(["export", GPT3, "--to", "torchtitan@0.2", "--model", "gpt3-175b"]) == 0
    cfg = tomllib.loads(capsys.readouterr().out)
    assert len(cfg["parallelism"]["module_fqns_per_model_part"]) == 24


def test_megatron_to_stdout_and_json_to_file(capsys, tmp_path):
    assert main(["export", GPT3, "--to", "megatron", "--model", "gpt3-175b"]) == 0
    out, err = capsys.readouterr()
    assert "--num-layers 96 \\" in out and "--num-layers-per-virtual-pipeline-stage 4" in out and err == ""
    target = tmp_path / "plan.json"
    assert main(["export", GPT3, "--to", "json", "-o", str(target)]) == 0
    assert Plan.from_json(target.read_text()) == Plan.parse(GPT3)
    assert capsys.readouterr().out == ""


def test_search_json_input_supplies_batch_and_sequence(capsys, tmp_path):
    f = tmp_path / "search.json"
    f.write_text(json.dumps([{"plan": "tp=2,pp=2,dp=2,zero=3", "estimate": {"global_batch": 16, "seq": 512}}]))
    assert main(["export", str(f), "--to", "torchtitan@0.2",
                 "--model", "llama:layers=4,hidden=64,heads=4,vocab=256"]) == 0
    cfg = tomllib.loads(capsys.readouterr().out)
    assert cfg["training"] == {"local_batch_size": 8, "global_batch_size": 16, "seq_len": 512}


def test_search_output_gives_the_global_batch_through_its_micro_batches(capsys, tmp_path):
    """`search --json` entries hold micro-batches per step (B / (dp·mbs)), not B itself."""
    f = tmp_path / "search.json"
    f.write_text(json.dumps([{"plan": "tp=2,pp=2,dp=2,mbs=2,zero=3", "estimate": {"microbatches": 4}}]))
    assert main(["export", str(f), "--to", "megatron"]) == 0
    assert "--global-batch-size 16" in capsys.readouterr().out


def test_export_output_is_deterministic(capsys):
    main(["export", GPT3, "--to", "torchtitan"])
    first = capsys.readouterr().out
    main(["export", GPT3, "--to", "torchtitan"])
    assert capsys.readouterr().out == first


@pytest.mark.parametrize("args, message", [
    (["tp=eight", "--to", "megatron"], "tp='eight' is not an integer"),
    (["tp=2,pp=2,layers=3-3", "--to", "megatron", "--model", "gpt3-175b"], "sums to 6, the model has 96"),
    (["pp=4,vpp=2,schedule=interleaved", "--to", "megatron", "--model", "llama:layers=4,hidden=64,heads=4,vocab=256"],
     "8 stages for only 4 layers"),
    (["dp=4", "--to", "megatron", "--global-batch", "6"], "not divisible into dp·mbs"),
    (["tp=2", "--to", "megatron", "--model", "nosuch"], "unknown model 'nosuch'"),
    (["missing.json", "--to", "json"], "plan file missing.json not found"),
])
def test_bad_input_exits_2_with_one_message(capsys, args, message):
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_bad_target_is_rejected_by_the_parser(cli):
    r = cli("export", "tp=2", "--to", "deepspeed")
    assert r.returncode == 2 and "invalid choice: 'deepspeed'" in r.stderr
