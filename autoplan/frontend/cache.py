"""On-disk cache of traced BlockGraphs (JSON), so repeated searches do not re-trace.

Key: sha256 of (model fingerprint, seq, batch, dtype, autoplan version, torch
version, hash of the frontend's own source).  The model fingerprint hashes
the model file (plus the transformers version) or the zoo sources and config.
A ``model.py`` that imports other local files is keyed on its own text only.

Location: ``$AUTOPLAN_CACHE_DIR`` or ``~/.cache/autoplan/traces``;
``AUTOPLAN_NO_CACHE=1`` disables it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

import autoplan
from autoplan.ir import BlockGraph

FRONTEND_DIR = Path(__file__).parent


def cache_dir() -> Path | None:
    if os.environ.get("AUTOPLAN_NO_CACHE", "") not in ("", "0"):
        return None
    root = os.environ.get("AUTOPLAN_CACHE_DIR") or "~/.cache/autoplan/traces"
    return Path(root).expanduser()


@functools.cache
def _code_hash() -> str:
    h = hashlib.sha256()
    for f in sorted(FRONTEND_DIR.glob("*.py")) + [FRONTEND_DIR.parent / "ir.py"]:
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def cache_key(fingerprint: str, seq: int, batch: int, dtype: str) -> str:
    parts = [fingerprint, seq, batch, dtype, autoplan.__version__, torch.__version__, _code_hash()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def load(key: str) -> BlockGraph | None:
    root = cache_dir()
    if root is None:
        return None
    path = root / f"{key}.json"
    try:
        return BlockGraph.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(key: str, graph: BlockGraph) -> None:
    """Write atomically; a cache that cannot be written is skipped silently."""
    root = cache_dir()
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(graph.to_json())
        os.replace(tmp, root / f"{key}.json")
    except OSError:
        pass
