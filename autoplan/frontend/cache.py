"""On-disk cache of traced BlockGraphs, so repeated searches do not re-trace.

Key: sha256 of (model fingerprint, seq, batch, dtype, autoplan version, torch
version, transformers version, hash of the frontend's own source, hash of the
local files the model file imports).  The model fingerprint hashes the model
file (plus the transformers version) or the zoo sources and config; the local
imports are the ``import x`` / ``from x import`` / ``from . import x`` of the
model file that resolve to ``.py`` files beside it, followed transitively.

Entry: one file ``<key>.json`` holding ``<sha256 of the payload>\\n<payload>``.
An entry whose checksum, JSON or fields do not check out (truncated, hand-edited,
written by another version) is deleted and the model traced again.  Writers
write a temporary file and ``os.replace`` it, so concurrent writers of the same
key cannot interleave: a reader sees one whole entry or none.

Location: ``$AUTOPLAN_CACHE_DIR`` or ``~/.cache/autoplan/traces``;
``AUTOPLAN_NO_CACHE=1`` disables it.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
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


@functools.cache
def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return ""


def local_imports(path: str) -> list[Path]:
    """The ``.py`` files beside ``path`` that it imports, transitively, sorted (``path`` excluded)."""
    root = Path(path).resolve()
    folder = root.parent
    seen: set[Path] = {root}
    todo = [root]
    while todo:
        try:
            tree = ast.parse(todo.pop().read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for name in _imported_names(tree):
            first = folder / Path(*name.split("."))
            for f in (first.with_suffix(".py"), first / "__init__.py"):
                if f.is_file() and f.resolve() not in seen:
                    seen.add(f.resolve())
                    todo.append(f.resolve())
    return sorted(seen - {root})


def _imported_names(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names += [base] if base else []
            names += [f"{base}.{a.name}" if base else a.name for a in node.names]
    return names


def _imports_hash(model_path: str) -> str:
    if not model_path or not os.path.isfile(model_path):
        return ""
    h = hashlib.sha256()
    folder = Path(model_path).resolve().parent
    for f in local_imports(model_path):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_key(fingerprint: str, seq: int, batch: int, dtype: str, model_path: str = "") -> str:
    """sha256 over everything that changes a trace (see the module docstring)."""
    parts = [fingerprint, seq, batch, dtype, autoplan.__version__, torch.__version__,
             _transformers_version(), _code_hash(), _imports_hash(model_path)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def load(key: str) -> BlockGraph | None:
    """The cached graph, or None (no cache, no entry, or a bad entry, which is deleted)."""
    root = cache_dir()
    if root is None:
        return None
    path = root / f"{key}.json"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, _, payload = data.partition(b"\n")
    try:
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise ValueError("checksum mismatch")
        graph = BlockGraph.from_json(payload.decode())
        if graph.to_json().encode() != payload:      # wrong-typed or extra fields
            raise ValueError("entry does not read back")
        return graph
    except Exception:  # noqa: BLE001  -- any bad entry: discard and retrace
        _discard(path)
        return None


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def store(key: str, graph: BlockGraph) -> None:
    """Write atomically; a cache that cannot be written is skipped silently."""
    root = cache_dir()
    if root is None:
        return
    payload = graph.to_json().encode()
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        os.replace(tmp, root / f"{key}.json")
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            _discard(Path(tmp))
