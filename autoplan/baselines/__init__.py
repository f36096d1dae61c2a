"""Hand-written baselines: the 4D/5D recipes engineers write today, as Plans.

    from autoplan.baselines import RECIPES, baseline
    plan = baseline("megatron", model, cluster, seq=2048, global_batch=1024, estimator=est)

Each recipe lives in its own module (``megatron``, ``megascale``, ``llama3``, ``fsdp``,
``deepseek``, ``published``: the layouts published runs used) as
``recipe(model, cluster, *, seq, global_batch, estimator) -> Plan``; its
docstring states the rules and every adaptation it makes to fit a model, cluster and
batch.  Recipes price candidates with the shared cost model only to decide whether they fit
in HBM, exactly as an engineer tries a config and backs off on out-of-memory.  A recipe that
cannot apply raises ``UserError`` saying why.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.baselines import deepseek, fsdp, llama3, megascale, megatron, published
from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from autoplan.plan import Plan
from topologies.cluster import Cluster

if TYPE_CHECKING:
    from autoplan.cost import Estimator

_MODULES = (megatron, megascale, llama3, fsdp, deepseek, published)
RECIPES = {m.NAME: m.recipe for m in _MODULES}
"""Recipe name → ``recipe(model, cluster, *, seq, global_batch, estimator) -> Plan``."""

SUMMARIES = {m.NAME: m.SUMMARY for m in _MODULES}
"""Recipe name → one line saying what it does."""

FAMILIES = {m.NAME: m.FAMILIES for m in _MODULES}
"""Recipe name → the model families ("dense", "moe") it was written for."""


def credible(name: str, model: BlockGraph) -> bool:
    """Whether recipe ``name`` is one an engineer would use on ``model``: written for its family
    (the llama3 recipe is not a plan for DeepSeek-V3), and for ``published`` only where the
    model has a published layout."""
    family = "moe" if model.model.experts else "dense"
    return family in FAMILIES[name] and (name != published.NAME or published.find(model) is not None)


def check_recipe(name: str) -> str:
    """``name`` if it is a recipe; UserError listing the recipes otherwise."""
    if name not in RECIPES:
        raise UserError(f"unknown recipe {name!r}", f"choose one of: {', '.join(RECIPES)}")
    return name


def baseline(name: str, model: BlockGraph, cluster: Cluster, *, seq: int, global_batch: int,
             estimator: Estimator) -> Plan:
    """The plan recipe ``name`` writes for ``model`` (traced at ``seq``) on ``cluster``."""
    check_recipe(name)
    if seq != model.seq_len:
        raise ValueError(f"model traced at seq {model.seq_len}, recipe asked for seq {seq}")
    if global_batch < 1:
        raise UserError(f"global batch must be ≥ 1, got {global_batch}", "pass --global-batch N with N ≥ 1")
    return RECIPES[name](model, cluster, seq=seq, global_batch=global_batch, estimator=estimator)


__all__ = ["FAMILIES", "RECIPES", "SUMMARIES", "baseline", "check_recipe", "credible"]
