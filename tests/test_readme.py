"""The README stays current: its two commands, and every CLI command and option in its reference."""
import os
import re

from autoplan.cli import COMMANDS, build_parser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(REPO, "README.md")).read()


def test_two_commands_and_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert any("autoplan search gpt3-175b --cluster h100x1024" in b for b in blocks)
    test_cmd = next(b for b in blocks if "pytest" in b)
    assert "pip install torch==2.13.0" in test_cmd
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert test_cmd.split("&&")[-1].strip() in ci


def test_cli_reference_lists_every_command_and_option():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in COMMANDS:
        assert name in sub.choices, name
        assert f"`autoplan {name}" in README, f"README misses `autoplan {name}`"
        row = next(line for line in README.splitlines() if line.startswith(f"| `autoplan {name}"))
        for action in sub.choices[name]._actions:
            for opt in action.option_strings:
                if opt in ("-h", "--help") or (opt.startswith("-") and not opt.startswith("--")
                                               and any(o.startswith("--") for o in action.option_strings)):
                    continue
                assert opt in row, f"README's row for `autoplan {name}` misses {opt}"
