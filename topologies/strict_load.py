"""YAML and JSON readers that refuse a key given twice in one mapping.

PyYAML and the json module both keep the last of two equal keys silently, so a cluster file with
two ``num_gpus:`` lines, or a plan file with two ``"tp"``, would be read as something the user did
not mean.  Every input file of autoplan (cluster YAML, ``--params``, ``--profile``, plan and
placement JSON, calibration measurements) is read through these two functions, which raise
``DuplicateKey`` (a ValueError) naming the key and, for YAML, its line; each caller turns it into
its own ``error:`` + ``fix:``.  Lives in ``topologies``, the lowest package, so that every
layer can use it.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml


class DuplicateKey(ValueError):
    """A mapping gives ``key`` twice (``line``: 1-based, YAML only)."""

    def __init__(self, key: object, line: int | None = None) -> None:
        self.key = key
        self.line = line
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"key {_short(key)} given twice in one mapping{where}")


def _short(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a repeated scalar key (merge keys ``<<`` are YAML's own)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a key given twice (``DuplicateKey``)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def load_json(text: str, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text)``, refusing a key given twice in one object (``DuplicateKey``)."""
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=parse_constant)
