"""Shared fixtures.  Traces are cached per session: tracing is the slow part."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m autoplan ARGS`` as a user would; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "autoplan", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def cli():
    return run_cli
