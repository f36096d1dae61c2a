"""Hand a Plan to other engines: torchtitan 0.3.0's command line (or 0.2.x TOML), Megatron-LM
arguments, or the plan's JSON.

``export(plan, to)`` returns an ``Export`` (text + warnings on what the engine
cannot express).  Each engine module names the version of the engine it targets.
"""
from __future__ import annotations

from autoplan.errors import UserError
from autoplan.export.base import PLAIN, Architecture, Export
from autoplan.export.megatron import to_megatron
from autoplan.export.torchtitan import to_torchtitan
from autoplan.export.torchtitan_toml import to_torchtitan_toml
from autoplan.plan import Plan

# torchtitan: 0.3.0's --module/--config and CLI overrides; torchtitan@0.2: the 0.2.x TOML JobConfig
ENGINES = ("torchtitan", "torchtitan@0.2", "megatron", "json")


def export(plan: Plan, to: str, *, num_layers: int | None = None, global_batch: int | None = None,
           seq: int | None = None, model: str | None = None, nvlink_domain: int | None = None,
           arch: Architecture = PLAIN) -> Export:
    """``plan`` for engine ``to`` (one of ``ENGINES``); ``model`` (a zoo name) picks torchtitan's config,
    ``nvlink_domain`` (GPUs per NVLink domain) Megatron's USP split, ``arch`` Megatron's MLA/MTP model
    arguments (torchtitan's registry config carries its own)."""
    if to == "torchtitan":
        return to_torchtitan(plan, num_layers=num_layers, global_batch=global_batch, seq=seq, model=model)
    if to == "torchtitan@0.2":
        return to_torchtitan_toml(plan, num_layers=num_layers, global_batch=global_batch, seq=seq)
    if to == "megatron":
        return to_megatron(plan, num_layers=num_layers, global_batch=global_batch, seq=seq,
                           nvlink_domain=nvlink_domain, arch=arch)
    if to == "json":
        return Export(engine="json", text=plan.to_json() + "\n")
    raise UserError(f"unknown export target {to!r}", f"use one of: {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Architecture", "Export", "export", "to_megatron", "to_torchtitan", "to_torchtitan_toml"]
