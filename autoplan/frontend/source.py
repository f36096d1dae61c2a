"""Where a model comes from: a ``model.py`` file, a zoo name or a family spec string.

``load_source(text)`` returns a ``ModelSource``: how to build the module (the
frontend calls ``build()`` under ``torch.device("meta")``), how to make its
example inputs, what is known about it up front (``ModelInfo`` for zoo and
spec models) and a fingerprint of its source for the trace cache.

A ``model.py`` defines ``build_model() -> nn.Module`` and optionally
``example_inputs(batch, seq)`` returning the positional inputs (a tensor or
a tuple) or the keyword inputs (a dict) of the model call (default: token
ids, a LongTensor [batch, seq]; see ``inputs``).  Every problem with the file is a ``UserError`` naming the
file and line.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan import zoo
from autoplan.errors import UserError
from autoplan.ir import ModelInfo
from autoplan.zoo.spec import is_spec, parse_spec

ZOO_DIR = Path(zoo.__file__).parent


@dataclass(frozen=True)
class ModelSource:
    """A buildable model.

    ``build()`` returns the module (allocates nothing under a meta device);
    ``example_inputs(batch, seq)`` its positional inputs or None for the
    default token ids; ``info`` is None when it must be inferred from the
    built module; ``with_experts(E)`` rebuilds an MoE model with E experts
    (used to find expert dims), None when not possible.
    """

    name: str
    kind: str                                   # file | zoo | spec
    build: Callable[[], nn.Module]
    fingerprint: str
    info: ModelInfo | None = None
    example_inputs: Callable[[int, int], Any] | None = None
    with_experts: Callable[[int], Callable[[], nn.Module]] | None = None
    path: str = ""
    max_seq: int = 0                            # learned positions (0: no limit known)


def load_source(text: str, seq: int = 0) -> ModelSource:
    """Resolve a model argument (file path, zoo name or ``family:key=value,...``); ``seq`` is the
    run's sequence length, which a gpt spec without ``max_seq`` takes (``parse_spec``)."""
    if text.endswith(".py") or os.sep in text or os.path.isfile(text):
        return _file_source(text)
    if is_spec(text):
        cfg = parse_spec(text, seq)
        return _config_source(text, "spec", cfg)
    if text in zoo.ZOO:
        return _config_source(text, "zoo", zoo.ZOO[text])
    if ":" in text:
        parse_spec(text)  # raises the unknown-family error
    raise UserError(f"unknown model {text!r}",
                    f"give a path to a model.py, a family spec such as "
                    f"'llama:layers=32,hidden=4096,heads=32,vocab=128256', or a zoo name: "
                    f"{', '.join(zoo.names())}")


def _zoo_fingerprint() -> str:
    h = hashlib.sha256()
    for f in sorted(ZOO_DIR.glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def _config_source(name: str, kind: str, cfg) -> ModelSource:
    fingerprint = hashlib.sha256((_zoo_fingerprint() + repr(cfg)).encode()).hexdigest()
    with_experts = None
    if zoo.family(cfg) == "moe":
        def with_experts(experts: int, cfg=cfg):
            return lambda: zoo.build(zoo.with_experts(cfg, experts))
    return ModelSource(name=name, kind=kind, build=lambda: zoo.build(cfg), fingerprint=fingerprint,
                       info=zoo.model_info(name, cfg), with_experts=with_experts,
                       max_seq=getattr(cfg, "max_seq", 0))


# --- model.py ------------------------------------------------------------------

def user_frame(exc: BaseException, path: str) -> str:
    """``file:line`` of the innermost traceback frame in ``path`` (else the innermost outside torch)."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)] if path else []
    if not inside:
        torch_dir = os.path.dirname(torch.__file__)
        inside = [f for f in frames if not f.filename.startswith(torch_dir)
                  and "/autoplan/frontend/" not in f.filename]
    if not inside:
        return ""
    f = inside[-1]
    code = f" ({f.line.strip()})" if f.line else ""
    return f"{f.filename}:{f.lineno}{code}"


def _file_source(path: str) -> ModelSource:
    if not os.path.isfile(path):
        raise UserError(f"model file {path!r} not found",
                        "give the path to a model.py that defines build_model()")
    try:
        source = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"model file {path!r} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})",
                        "give the path to a model.py saved as UTF-8 that defines build_model()") from None
    except OSError as e:
        raise UserError(f"cannot read model file {path!r}: {e.strerror or e}",
                        "give the path to a readable model.py that defines build_model()") from None
    try:
        compile(source, path, "exec")
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error: {e.msg}",
                        "fix the Python syntax in the model file") from None
    digest = hashlib.sha256(source.encode()).hexdigest()
    module = _import_file(path, digest)
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise UserError(f"{path} defines no build_model()",
                        "add `def build_model() -> torch.nn.Module:` returning the model")
    example = getattr(module, "example_inputs", None)
    fingerprint = hashlib.sha256((digest + _library_versions()).encode()).hexdigest()
    return ModelSource(name=_file_model_name(path), kind="file", build=build, fingerprint=fingerprint,
                       example_inputs=example if callable(example) else None, path=path)


def _file_model_name(path: str) -> str:
    """``models/hf_llama.py`` → ``hf_llama``; ``llama/model.py`` → ``llama``."""
    p = Path(path).resolve()
    return p.parent.name if p.stem == "model" and p.parent.name else p.stem


def _library_versions() -> str:
    try:
        import transformers
        return f"transformers={transformers.__version__}"
    except ImportError:
        return ""


def _import_file(path: str, digest: str):
    name = f"autoplan_user_model_{digest[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:          # no loader for the suffix: not a .py file
        raise UserError(f"model file {path!r} is not a Python file",
                        "give the path to a model.py that defines build_model()")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any import-time failure is the user's
        where = user_frame(e, path) or path
        raise UserError(f"importing {path} failed at {where}: {type(e).__name__}: {e}",
                        "fix the error in the model file") from None
    finally:
        sys.path.remove(folder)
    sys.modules[name] = module
    return module


def build_on_meta(source: ModelSource, build: Callable[[], nn.Module] | None = None) -> nn.Module:
    """Call the model's builder under ``torch.device("meta")``; failures are ``UserError``s."""
    build = build or source.build
    try:
        with torch.device("meta"):
            model = build()
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001
        where = user_frame(e, source.path)
        at = f" at {where}" if where else ""
        raise UserError(f"build_model() of {source.name} raised{at}: {type(e).__name__}: {e}",
                        "fix build_model() so that it returns an nn.Module") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"build_model() of {source.name} returned {type(model).__name__}, not an nn.Module",
                        "return the torch.nn.Module to plan for")
    return model
