"""The README stays current: its two commands, and every CLI command and option in its reference."""
import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest

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


EVERY_COMMAND = ("--verbose",)      # documented once, above the table


def test_cli_reference_lists_every_command_and_option():
    for opt in EVERY_COMMAND:
        assert f"`{opt}`" in README.split("## CLI reference", 1)[1].split("| command |", 1)[0]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in COMMANDS:
        assert name in sub.choices, name
        assert f"`autoplan {name}" in README, f"README misses `autoplan {name}`"
        row = next(line for line in README.splitlines() if line.startswith(f"| `autoplan {name}"))
        for action in sub.choices[name]._actions:
            for opt in action.option_strings:
                if opt in ("-h", "--help", *EVERY_COMMAND) or (opt.startswith("-") and not opt.startswith("--")
                                               and any(o.startswith("--") for o in action.option_strings)):
                    continue
                assert opt in row, f"README's row for `autoplan {name}` misses {opt}"


def _python_snippet() -> str:
    return next(b for b in re.findall(r"```python\n(.*?)\n```", README, re.S) if "apply(" in b)


@pytest.mark.slow
def test_api_snippet_runs_as_written(tmp_path):
    """The README's Python API script, as written, under torchrun on 2 CPU processes."""
    script = tmp_path / "train.py"
    script.write_text(_python_snippet() + "\n")
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = sorted(re.findall(r"rank (\d): loss (\d+\.\d+)", out.stdout))
    assert [r for r, _ in losses] == ["0", "1"]
    assert float(losses[0][1]) == float(losses[1][1])          # tp ranks hold one loss
    assert abs(float(losses[0][1]) - math.log(256)) < 0.5       # a fresh model: about ln(vocab)


def test_readme_snippet_uses_the_real_api():
    snippet = _python_snippet()
    assert "init_process_group" in snippet and "Plan.parse" in snippet and "from autoplan.apply import apply" in snippet
    from autoplan.apply import apply

    assert callable(apply)


def _figures():
    spec = importlib.util.spec_from_file_location("readme_figures",
                                                  os.path.join(REPO, "experiments", "readme_figures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_block_is_in_the_readme_and_produced_by_the_script():
    figures = _figures()
    for name in figures.BLOCKS:
        assert README.count(f"<!-- {name}:start -->") == 1 and README.count(f"<!-- {name}:end -->") == 1, name
    assert "python experiments/readme_figures.py" in README
    text = "a <!-- x:start -->old<!-- x:end --> b\n<!-- y:start -->\nold\n<!-- y:end -->\n"
    text = figures.replace_block(figures.replace_block(text, "x", "new"), "y", "two\nlines")
    assert text == "a <!-- x:start -->new<!-- x:end --> b\n<!-- y:start -->\ntwo\nlines\n<!-- y:end -->\n"


def test_readme_test_command_prints_the_passed_line():
    """pytest's closing ``N passed`` line is gone at -qq: the command's -q and addopts must not add up."""
    import shlex

    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    addopts = shlex.split(re.search(r'^addopts = "(.*)"$', pyproject, re.M).group(1))
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    command = shlex.split(next(b for b in blocks if "pytest" in b).split("&&")[-1])
    quiet = sum(a.count("q") for a in addopts + command if re.fullmatch(r"-q+", a))
    assert quiet <= 1, (addopts, command)


# Figures the README states outside generated blocks are definitions, defaults or hardware, never
# measurements: each is listed here with what it is.  A measured figure belongs in a block.
DEFINITIONS = {
    "0.5 %": "fold/tie threshold (search/robust.py)", "2 ×": "cp=4 split as 2 × 2", "2,pp": "plan string",
    "2.5×": "flash backward FLOP ratio (torch's flop counter)", "30 %": "explain's SP rule threshold",
    "50 %": "explain's CP rule threshold", "55 %": "healthy dense MFU band", "45 %": "healthy MoE MFU band",
    "4 GiB": "default --memory-margin", "4×": "GB200 NICs per tray", "80 %": "the nic.yaml perturbation",
    "80GB": "A100 80GB model name", "8×": "rails per node",
    "400 GB": "A800/H800 NVLink datasheet figure (400 GB/s bidirectional)",
}


def _figures_outside_blocks(text: str) -> set[str]:
    text = re.sub(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return set(re.findall(r"(?<![\w.])(\d[\d,.]*\s?(?:%|s\b|GiB|GB\b|min\b|ms\b|×|x\b|pp\b))", text))


def test_no_measured_figure_outside_generated_blocks():
    assert _figures_outside_blocks(README) <= set(DEFINITIONS), _figures_outside_blocks(README) - set(DEFINITIONS)
    assert _figures_outside_blocks("took 3.2 s, <!-- a:start -->4.1 s<!-- a:end -->") == {"3.2 s"}
    from autoplan.cost.memory import DEFAULT_MARGIN_GIB

    assert DEFAULT_MARGIN_GIB == 4 and "(default 4 GiB)" in README      # a stated default is the code's


def test_study_answers_block_is_the_studies_results():
    """The "What autoplan finds" lines are read from experiments/study/QN/results.json, each with
    its error band: a rerun study must be followed by `readme_figures.py --only study-answers`."""
    block = README.split("<!-- study-answers:start -->\n", 1)[1].split("\n<!-- study-answers:end -->", 1)[0]
    assert block == _figures().study_answers(2)
    assert block.count("error band ±") == 5
