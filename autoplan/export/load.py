"""PLAN arguments: a plan string, or a JSON file from ``autoplan search --json`` or ``Plan.to_json``.

Everything read from a file is checked before it reaches ``Plan``: the file is at most
``MAX_PLAN_FILE_BYTES``, UTF-8, JSON, at most ``MAX_DEPTH`` levels deep; a plan object
has only ``Plan``'s keys, each an integer (``0 <= n <= MAX_DEGREE``), a boolean, a
string or a list of those.  Anything else is a ``UserError`` naming what was found.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from autoplan.errors import UserError, short_repr
from autoplan.plan import KEYS, Plan

if TYPE_CHECKING:
    from autoplan.layout import Layout

_JSON_FORMS = ("a plan string, a Plan.to_json file, or `autoplan search --json` output "
               "(a list of {plan, estimate}; the first entry is used)")
MAX_PLAN_FILE_BYTES = 16 * 2 ** 20
MAX_DEPTH = 32
MAX_DEGREE = 2 ** 24


def load_plan(text: str, num_gpus: int | None = None) -> Plan:
    """The plan named by ``text``: a path to a JSON file if one exists there, else a plan string."""
    if text.endswith(".json") or os.path.isfile(text):
        return plan_of(read_json(text))
    return Plan.parse(text, num_gpus=num_gpus)


_PLANS_FORMS = "a text file with one plan string per line (# comments allowed), or a JSON list of plans"


def load_plans(path: str, num_gpus: int | None = None) -> list[Plan]:
    """Every plan of the file at ``path``, in order: one plan string per line (blank lines and
    ``#`` comments skipped), or a JSON list whose entries are plan strings, ``Plan.to_json``
    objects or ``search --json`` entries.  A bad entry is a UserError naming it."""

    try:
        size = os.path.getsize(path)
        if size > MAX_PLAN_FILE_BYTES:
            raise UserError(f"plans file {path} is {size:,} bytes, more than {MAX_PLAN_FILE_BYTES:,}",
                            f"give {_PLANS_FORMS}")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"plans file {path} not found", f"give {_PLANS_FORMS}") from None
    except UnicodeDecodeError:
        raise UserError(f"plans file {path} is not text (not UTF-8)", f"give {_PLANS_FORMS}") from None
    except OSError as e:
        raise UserError(f"cannot read plans file {path}: {e}", f"give {_PLANS_FORMS}") from None
    if text.lstrip().startswith("["):
        data = read_json(path)
        entries = [(f"entry {i}", item) for i, item in enumerate(data)]
    else:
        entries = [(f"line {i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                   if line.strip() and not line.strip().startswith("#")]
    if not entries:
        raise UserError(f"plans file {path} holds no plan", f"give {_PLANS_FORMS}")
    plans = []
    for where, item in entries:
        try:
            plans.append(Plan.parse(item, num_gpus=num_gpus) if isinstance(item, str) else plan_of([item]))
        except UserError as e:
            raise UserError(f"plans file {path}, {where}: {e.problem}", e.fix) from None
    return plans


def read_json(path: str) -> Any:
    """The parsed JSON file at ``path``; UserError if it is missing, too big, binary, not JSON, too
    deep or gives a key twice in one object."""
    from topologies.strict_load import DuplicateKey, load_json

    try:
        size = os.path.getsize(path)
        if size > MAX_PLAN_FILE_BYTES:
            raise UserError(f"plan file {path} is {size:,} bytes, more than a plan file holds "
                            f"({MAX_PLAN_FILE_BYTES:,})", f"give {_JSON_FORMS}")
        with open(path, "rb") as f:
            data = load_json(f.read().decode("utf-8"), parse_constant=_no_constant)
    except DuplicateKey as e:
        raise UserError(f"plan file {path}: {e}", "keep one of them") from None
    except FileNotFoundError:
        raise UserError(f"plan file {path} not found", f"give {_JSON_FORMS}") from None
    except UnicodeDecodeError:
        raise UserError(f"plan file {path} is not text (not UTF-8)", f"give {_JSON_FORMS}") from None
    except RecursionError:
        raise UserError(f"plan file {path} is nested too deeply to be a plan", f"give {_JSON_FORMS}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read plan file {path}: {e}", f"give {_JSON_FORMS}") from None
    if _depth(data) > MAX_DEPTH:
        raise UserError(f"plan file {path} is nested more than {MAX_DEPTH} levels deep", f"give {_JSON_FORMS}")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a plan can hold")


def _depth(value: Any) -> int:
    """Nesting depth, iteratively (a deep list must not blow the stack here either)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        todo += [(c, d + 1) for c in children]
    return deepest


def first_entry(data: Any) -> Any:
    """The first candidate of a search result list, or the object itself."""
    if isinstance(data, list):
        if not data:
            raise UserError("the plan file holds an empty list of plans", f"give {_JSON_FORMS}")
        return data[0]
    return data


def plan_of(data: Any) -> Plan:
    entry = first_entry(data)
    if isinstance(entry, dict) and "schema_version" in entry:
        return _from_fields(entry, envelope=True)
    if isinstance(entry, dict) and "plan" in entry:
        inner = entry["plan"]
        if isinstance(inner, str):
            return Plan.parse(inner)
        if isinstance(inner, dict):
            return _from_fields(inner)
        raise UserError(f"the plan file's \"plan\" is {short_repr(inner)}, not a plan string or object",
                        f"give {_JSON_FORMS}")
    if isinstance(entry, dict) and "plan_string" in entry:
        if not isinstance(entry["plan_string"], str):
            raise UserError(f"the plan file's plan_string is {short_repr(entry['plan_string'])}, not a string",
                            f"give {_JSON_FORMS}")
        return Plan.parse(entry["plan_string"])
    if isinstance(entry, str):
        return Plan.parse(entry)
    raise UserError(f"the plan file holds no plan (found {type(entry).__name__} {short_repr(entry)})",
                    f"give {_JSON_FORMS}")


def _from_fields(d: dict, envelope: bool = False) -> Plan:
    """``Plan.from_json`` / ``from_fields`` after checking keys and value types."""
    fields: Any = d.get("plan") if envelope else d         # JSON: checked below
    if envelope and not isinstance(fields, dict):
        raise UserError(f"the plan file's \"plan\" is {short_repr(fields)}, not an object", f"give {_JSON_FORMS}")
    unknown = sorted(str(k) for k in fields if k not in KEYS)
    if unknown:
        raise UserError(f"the plan object has unknown key(s) {', '.join(unknown)}",
                        f"use only {', '.join(KEYS)}")
    for key, value in fields.items():
        items = value if isinstance(value, list) else [value]
        if not all(_scalar_ok(v) for v in items):
            raise UserError(f"the plan object's {key} is {short_repr(value)}",
                            f"give {key} as an integer 0..{MAX_DEGREE:,}, a string, or a list of those")
    try:
        return Plan.from_json(d) if envelope else Plan.from_fields(dict(fields))
    except (TypeError, ValueError, OverflowError) as e:
        raise UserError(f"the plan object does not make a plan: {e}", f"give {_JSON_FORMS}") from None


def _scalar_ok(v: Any) -> bool:
    if isinstance(v, (bool, str)):
        return True
    if isinstance(v, int):
        return 0 <= v <= MAX_DEGREE
    if isinstance(v, float):
        return math.isfinite(v) and v.is_integer() and 0 <= v <= MAX_DEGREE
    return False


def load_layout(text: str) -> Layout | None:
    """The tensor-parallel Layout stored with the first plan of a search result file, or None
    (a plan string, or a file without a layout: a tp = 1 plan, or a Plan.to_json file)."""
    from autoplan.layout import Layout

    if not (text.endswith(".json") or os.path.isfile(text)):
        return None
    entry = first_entry(read_json(text))
    if isinstance(entry, dict) and entry.get("layout") is not None:
        return Layout.from_dict(entry["layout"])
    return None


def entry_value(data: Any, key: str) -> Any:
    """``key`` of the first entry, or of its estimate (e.g. global_batch, seq), or None."""
    entry = first_entry(data)
    if not isinstance(entry, dict):
        return None
    if key in entry:
        return entry[key]
    estimate = entry.get("estimate")
    return estimate.get(key) if isinstance(estimate, dict) else None
