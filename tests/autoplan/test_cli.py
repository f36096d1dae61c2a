"""The command line's own boundary: what ``main`` leaves behind in the process that called it."""
from __future__ import annotations

import os

from autoplan.cli import main


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
