"""The engines' own checks, for the export tests: torchtitan 0.3.0's config loader (run in a child
process, ``torchtitan_loader.py``), Megatron-LM's ``validate_args`` constraints
(``megatron_validate_args.py``), and the searched plans they are tried on (``data/top_plans.json``,
written by ``make_top_plans.py``)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
TORCHTITAN_VERSION = "0.3.0"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"export_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def megatron_rules():
    """``check(argv, world_size=…, model=…)``: the validate_args assertions the arguments fail."""
    return _module("megatron_validate_args")


@pytest.fixture(scope="session")
def top_plan_cases():
    """(model, cluster, seq, global batch, plans) of the six searches, from the committed fixture."""
    return _module("make_top_plans"), json.loads((HERE / "data" / "top_plans.json").read_text())


@pytest.fixture(scope="session")
def torchtitan_load(tmp_path_factory):
    """``load([(argv, world_size[, gpu]), ...])`` → torchtitan 0.3.0's parsed values per argument list
    (``gpu``: h100 or b200, what the converters' capability check is answered as)."""
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (pip install --no-deps torchtitan==0.3.0 and the config "
                    "loader's small deps, as .ci/run does)")
    version = importlib.metadata.version("torchtitan")
    assert version == TORCHTITAN_VERSION, f"torchtitan {version} installed, the exporter targets {TORCHTITAN_VERSION}"
    cwd = tmp_path_factory.mktemp("torchtitan")

    def load(requests):
        payload = json.dumps([{"argv": list(r[0]), "world_size": r[1], "gpu": r[2] if len(r) > 2 else "h100"}
                              for r in requests])
        # this checkout's autoplan first: a low-precision export names autoplan.export.torchtitan_precision
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        done = subprocess.run([sys.executable, str(HERE / "torchtitan_loader.py")], input=payload, text=True,
                              capture_output=True, cwd=cwd, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout)["results"]

    return load
