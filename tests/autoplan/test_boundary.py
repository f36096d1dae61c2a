"""Hostile input at the command line's boundary (issue 37 item 5): each class ends in ``error:`` and
``fix:``, exit 2, no traceback; a model's prints stay off stdout; random bytes, plan strings and
YAML through every command give exit 0 or 2 and never a traceback."""
from __future__ import annotations

import json
import os
import random

import pytest

from autoplan.cli import main

TWO_HEADS = "gpt:layers=2,hidden=64,heads=2,vocab=128"


def user_error(capsys, *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "\n  fix: " in err and "Traceback" not in err, err
    return err


def test_a_model_file_that_is_not_utf8(capsys, tmp_path):
    path = tmp_path / "model.py"
    path.write_bytes(b"\xff\xfe\x00d\x00e\x00f")
    for argv in (["trace", str(path)], ["export", "tp=1", "--to", "json", "--model", str(path)]):
        assert "is not UTF-8 text" in user_error(capsys, *argv)


@pytest.mark.parametrize("plan", ["tp=0", "pp=0", "cp=0", "tp=-2", "tp=𝟐", "tp=2.5", "tp=٢"])
def test_a_degree_that_is_not_a_positive_ascii_integer(capsys, plan):
    err = user_error(capsys, "estimate", TWO_HEADS, "--cluster", "h100x8", "--plan", plan, "--seq", "64",
                     "--global-batch", "8")
    assert "bad plan" in err


@pytest.mark.parametrize("plan, problem", [
    ("tp=4", "does not divide the model's 2 attention heads"),
    ("pp=2,layers=1x0", "layers"),
    ("tp=𝟐", "is not an integer"),
    ("ep=2,dp=2", "has no experts"),
])
def test_export_checks_the_plan_against_the_model(capsys, plan, problem):
    assert problem in user_error(capsys, "export", plan, "--to", "megatron", "--model", TWO_HEADS)


def test_export_of_a_plan_file_with_a_boolean_schema_version(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": True, "plan": {"tp": 2}}))
    assert "schema_version" in user_error(capsys, "export", str(path), "--to", "json")


def test_export_of_a_build_model_that_returns_no_module(capsys, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("def build_model():\n    return 42\n")
    assert "returned int, not an nn.Module" in user_error(capsys, "export", "tp=1", "--to", "json", "--model",
                                                          str(path))


def test_a_forward_that_needs_two_inputs_is_told_of_example_inputs(capsys, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("import torch\nfrom torch import nn\n"
                    "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.l = nn.Linear(16, 16)\n    def forward(self, x):\n        return self.l(x)\n"
                    "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.layers = nn.ModuleList([Block() for _ in range(2)])\n"
                    "    def forward(self, x, mask):\n        for b in self.layers:\n            x = b(x)\n"
                    "        return x * mask\n"
                    "def build_model():\n    return M()\n")
    err = user_error(capsys, "trace", str(path), "--seq", "8")
    assert "example_inputs(batch, seq)" in err.split("  fix: ")[1]


def test_a_model_that_prints_at_import_keeps_trace_json_clean(capsys, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("print('hello from the model')\n"
                    "from autoplan.frontend.source import load_source\n"
                    "def build_model():\n    print('building')\n"
                    "    return load_source('gpt:layers=2,hidden=64,heads=4,vocab=128').build()\n")
    assert main(["trace", str(path), "--seq", "16", "--json", "--no-cache"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"] and "hello from the model" in err and "building" in err


# --- property: random input through every command ---------------------------------------------

PLAN_ALPHABET = "tpdcevmbzoerlaysh=,x-0123456789·𝟐٢ .:_"
COMMAND_LINES = (   # {} is the random input
    ("export", "{}", "--to", "json"),
    ("export", "{}", "--to", "megatron", "--model", TWO_HEADS),
    ("estimate", TWO_HEADS, "--cluster", "h100x8", "--plan", "{}", "--seq", "64", "--global-batch", "8",
     "--samples", "0"),
    ("memcheck", "{}", "--model", TWO_HEADS, "--cluster", "h100x8", "--seq", "64", "--global-batch", "8"),
    ("explain", "{}", "--model", TWO_HEADS, "--cluster", "h100x8", "--seq", "64", "--global-batch", "8"),
    ("clusters", "{}"),
    ("trace", "{}"),
    ("search", TWO_HEADS, "--cluster", "{}", "--seq", "64", "--global-batch", "8", "--workers", "1"),
    ("estimate", TWO_HEADS, "--cluster", "h100x8", "--plan", "tp=1", "--params", "{}", "--seq", "64",
     "--global-batch", "8", "--samples", "0"),
)


def _random_input(rng: random.Random, tmp_path) -> str:
    kind = rng.choice(("plan", "bytes", "yaml", "json"))
    if kind == "plan":
        return "".join(rng.choice(PLAN_ALPHABET) for _ in range(rng.randint(0, 24))) or "tp=1"
    path = tmp_path / f"input{rng.randrange(10 ** 6)}.{rng.choice(('py', 'yaml', 'json', 'txt'))}"
    if kind == "bytes":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
    elif kind == "yaml":
        keys = ["gpu", "nodes", "gpus_per_node", "tp", "schema_version", "nic_efficiency", "a", "a"]
        values = ["h100", "1", "-1", "0", "true", "~", "[1, 2]", "{x: 1}", "&a [*a]", "𝟐", "1e400", "'x'"]
        path.write_text("\n".join(f"{rng.choice(keys)}: {rng.choice(values)}" for _ in range(rng.randint(0, 6))))
    else:
        fields = {rng.choice(["tp", "pp", "dp", "plan", "schema_version", "layers"]): rng.choice(
            [0, 1, 2, -1, True, None, "2", 2.5, [1, 0], {"tp": 2}]) for _ in range(rng.randint(0, 4))}
        path.write_text(json.dumps(fields))
    return str(path)


def _property(capsys, tmp_path, seed: int, cases: int) -> None:
    rng = random.Random(seed)
    for _ in range(cases):
        line = rng.choice(COMMAND_LINES)
        value = _random_input(rng, tmp_path)
        argv = [value if a == "{}" else a for a in line]
        try:
            code = main(argv)
        except SystemExit as e:          # --help-like input
            code = e.code
        out, err = capsys.readouterr()
        assert code in (0, 2), (argv, err[-2000:])
        assert "Traceback" not in out + err, (argv, err[-2000:])
        if code == 2:
            assert err.startswith("error: ") and "\n  fix: " in err, (argv, err)


def test_random_input_through_every_command_exits_0_or_2(capsys, tmp_path):
    _property(capsys, tmp_path, seed=int(os.environ.get("AUTOPLAN_FUZZ_SEED", "37")), cases=25)


@pytest.mark.fuzz
def test_random_input_through_every_command_long(capsys, tmp_path):
    seed = int(os.environ.get("AUTOPLAN_FUZZ_SEED", random.SystemRandom().randrange(10 ** 6)))
    print(f"AUTOPLAN_FUZZ_SEED={seed}")
    _property(capsys, tmp_path, seed=seed, cases=400)


def test_memcheck_of_a_world_too_big_to_measure_refuses_at_once(capsys):
    err = user_error(capsys, "memcheck", "tp=2", "--model", TWO_HEADS, "--cluster", "h100x100000", "--seq", "64",
                     "--global-batch", "100000")
    assert "100,000 GPUs" in err and "--cluster h100x16384" in err
