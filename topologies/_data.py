"""Read the YAML data files shipped inside the ``topologies`` package (cached, read-only)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from topologies.strict_load import load_yaml

DATA_DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def read_yaml(relative_path: str) -> Any:
    """The parsed content of ``topologies/<relative_path>``.  Callers must not mutate it."""
    with open(DATA_DIR / relative_path, encoding="utf-8") as f:
        return load_yaml(f.read())
