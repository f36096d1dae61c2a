"""PLAN arguments: a plan string, or a JSON file from ``autoplan search --json`` or ``Plan.to_json``."""
from __future__ import annotations

import json
import os
from typing import Any

from autoplan.errors import UserError
from autoplan.plan import Plan

_JSON_FORMS = ("a plan string, a Plan.to_json file, or `autoplan search --json` output "
               "(a list of {plan, estimate}; the first entry is used)")


def load_plan(text: str, num_gpus: int | None = None) -> Plan:
    """The plan named by ``text``: a path to a JSON file if one exists there, else a plan string."""
    if text.endswith(".json") or os.path.isfile(text):
        return plan_of(read_json(text))
    return Plan.parse(text, num_gpus=num_gpus)


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"plan file {path} not found", f"give {_JSON_FORMS}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read plan file {path}: {e}", f"give {_JSON_FORMS}") from None


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
        return Plan.from_json(entry)
    if isinstance(entry, dict) and "plan" in entry:
        inner = entry["plan"]
        if isinstance(inner, str):
            return Plan.parse(inner)
        if isinstance(inner, dict):
            return Plan.from_json(inner)
    if isinstance(entry, dict) and "plan_string" in entry:
        return Plan.parse(entry["plan_string"])
    if isinstance(entry, str):
        return Plan.parse(entry)
    raise UserError("the plan file holds no plan", f"give {_JSON_FORMS}")


def entry_value(data: Any, key: str) -> Any:
    """``key`` of the first entry, or of its estimate (e.g. global_batch, seq), or None."""
    entry = first_entry(data)
    if not isinstance(entry, dict):
        return None
    if key in entry:
        return entry[key]
    estimate = entry.get("estimate")
    return estimate.get(key) if isinstance(estimate, dict) else None
