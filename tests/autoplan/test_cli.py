"""The command line's own boundary: what ``main`` leaves behind in the process that called it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.cli import COMMANDS, build_parser, main

REPO = str(Path(__file__).resolve().parents[2])


def test_trace_timeout_reaches_the_tracer_and_leaves_the_environment_alone(capsys, tmp_path):
    path = tmp_path / "hang.py"
    path.write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    before = _ours(os.environ)
    for argv in (["trace", str(path)], ["export", "tp=1", "--to", "json", "--model", str(path)]):
        assert main([*argv, "--trace-timeout", "1"]) == 2
        assert "took more than 1 s" in capsys.readouterr().err
    assert _ours(os.environ) == before


def _ours(env) -> dict[str, str]:
    """The environment less what torch's inductor sets for itself on import (its cache directory)."""
    return {k: v for k, v in env.items() if not k.startswith("TORCHINDUCTOR_")}


# --- start-up: the parser imports only what the chosen command needs ----------------------------

_IMPORTS = r"""
import sys
from autoplan.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "numpy", "autoplan.cost", "autoplan.frontend", "autoplan.search")
               if m in sys.modules)
print("HEAVY", ",".join(heavy), "CODE", code, file=sys.stderr)
"""


def _heavy_imports(*argv: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _IMPORTS, *argv], capture_output=True, text=True, cwd=REPO,
                         timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    line = out.stderr.strip().splitlines()[-1]
    _, heavy, _, code = line.split(" ")
    return heavy, int(code)


@pytest.mark.parametrize("argv", [["--help"], *([c, "--help"] for c in COMMANDS)], ids=" ".join)
def test_help_imports_neither_torch_nor_numpy(argv):
    assert _heavy_imports(*argv) == ("", 0)


@pytest.mark.parametrize("argv", [["serch"], ["search", "gpt3-175b", "--cluster", "h100x8", "--seq", "abc"],
                                  ["memcheck", "tp=2", "--model", "gpt3-175b"],
                                  ["export", "tp=2", "--to", "torchtitian"]], ids=" ".join)
def test_a_usage_error_imports_neither_torch_nor_numpy(argv):
    assert _heavy_imports(*argv) == ("", 2)


def test_the_command_list_is_each_commands_own_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {a.dest: a.help for a in sub._choices_actions} == COMMANDS


# --- usage errors: error: and fix:, exit 2 -----------------------------------------------------

@pytest.mark.parametrize("argv, problem, fix", [
    (["export", "tp=2", "--to", "torchtitian"], "invalid choice: 'torchtitian'", "did you mean 'torchtitan'?"),
    (["search", "gpt3-175b", "--cluster", "h100x8", "--seq", "abc"], "--seq: invalid int value: 'abc'",
     "give --seq a whole number"),
    (["search", "gpt3-175b", "--cluster", "h100x8", "--globl-batch", "8"], "unrecognized arguments: --globl-batch",
     "did you mean --global-batch?"),
    (["estimate", "gpt3-175b", "--plan", "tp=2"], "required: --cluster", "add --cluster"),
    (["serch"], "invalid choice: 'serch'", "did you mean 'search'?"),
    ([], "required: COMMAND", "add COMMAND"),
])
def test_usage_errors_say_error_and_fix(capsys, argv, problem, fix):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and problem in err.splitlines()[0], err
    assert err.splitlines()[1].startswith("  fix: ") and fix in err.splitlines()[1], err
    assert len(err.splitlines()) == 2 and "Traceback" not in err
