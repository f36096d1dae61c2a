"""torchtitan 0.3.0 config functions with low-precision linear layers, for ``autoplan export --to torchtitan``.

torchtitan 0.3.0 sets its model converters (float8, MXFP8) in Python only: ``model_registry(flavor,
converters=[...])`` inside a ``config_registry`` function, with no CLI override.  Its
``ConfigManager`` takes any importable module as ``--module`` and calls ``getattr(module, --config)``,
so this module answers every name ``<registry module>__<registry function>__<recipe>`` with a function
that builds that registry config and converts its transformer blocks' linear layers:

* ``rowwise``: ``Float8LinearConverter`` with ``recipe_name="rowwise"`` (0.3.0's recipes are rowwise
  and rowwise_with_gw_hp: no tensorwise, no FSDP float8 all-gather),
* ``mxfp8``: ``MXFP8LinearConverter`` (Blackwell).

The LM head stays bf16, as the plan prices it (``costmodels.precision``): float8 skips ``lm_head``
(``filter_fqns``), MXFP8 converts only the blocks' linears (``fqns=["layers."]``).  The conversion is
``model_registry``'s own (``converter.build().convert(model config)``), applied to the registry's
model config.  Imported by torchtitan where it runs (autoplan installed beside it), never by autoplan.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

RECIPES = ("rowwise", "mxfp8")
SEPARATOR = "__"


def config_name(module: str, config: str, recipe: str) -> str:
    """The ``--config`` that builds torchtitan's ``module.config_registry.config`` with ``recipe``."""
    return SEPARATOR.join((module, config, recipe))


def _converter(recipe: str, compile_enabled: bool) -> Any:
    from torchtitan.components.quantization import (  # type: ignore[import-untyped]
        Float8LinearConverter,
        MXFP8LinearConverter,
    )

    if recipe == "rowwise":
        return Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"],
                                            model_compile_enabled=compile_enabled)
    return MXFP8LinearConverter.Config(fqns=["layers."], model_compile_enabled=compile_enabled)


def _build(module: str, config: str, recipe: str) -> Any:
    registry = importlib.import_module(f"torchtitan.models.{module}.config_registry")
    trainer_config = getattr(registry, config)()
    compile_enabled = trainer_config.compile.enable and "model" in trainer_config.compile.components
    spec = trainer_config.model_spec
    model = _converter(recipe, compile_enabled).build().convert(spec.model)
    trainer_config.model_spec = dataclasses.replace(spec, model=model)
    return trainer_config


def __getattr__(name: str) -> Any:
    parts = name.split(SEPARATOR)
    if len(parts) != 3 or parts[2] not in RECIPES:
        raise AttributeError(name)
    module, config, recipe = parts
    return lambda: _build(module, config, recipe)
