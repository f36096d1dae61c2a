"""The routed-expert region of a traced MoE block: router, dispatch, experts, combine.

A training engine does not run this part of a MoE layer as the traced ops say (a static
capacity buffer, batched matmuls over every expert): Megatron-Core, torchtitan and DeepSeek's
stack route each GPU's own tokens, permute them by expert, send them to the experts' ranks
(all-to-all or DeepEP), run grouped GEMMs on the experts they hold, send the results back and
unpermute them — whatever the attention's tensor-parallel layout.  So the block ILP leaves the
region alone (``autoplan.sharding``: one fixed layout, no seconds) and ``autoplan.cost.ep``
prices it as the engine runs it.

Which nodes (``routed_region``), from the module tree the frontend recorded:

* the **experts module** owns the expert weights (parameters with an ``expert`` dim of three or
  more dims: [E, h, f]); its parent is the **MoE module** (the zoo's ``moe``, transformers'
  ``mlp`` / ``block_sparse_moe``);
* the **router** is a child of the MoE module whose parameters are all 2-D with a dim of size E
  (the gate [E, h]); any other child that owns parameters (shared experts) is not routed;
* the region is every op inside the MoE module but outside those other children, every op with
  no module whose inputs all come from the region (the sum of two expert-GEMM gradients), and the
  parameters of the experts module and the router.

A model without expert weights has no region.
"""
from __future__ import annotations

from autoplan.ir import OpGraph, OpNode


def routed_region(graph: OpGraph) -> frozenset[str]:
    """Names of the nodes (parameters included) of the graph's routed-expert region (module
    docstring); empty without experts.  Remembered on the graph."""
    cached = graph.__dict__.get("_routed_region")
    if cached is None:
        cached = _region(graph)
        object.__setattr__(graph, "_routed_region", cached)
    return cached


def routed_params(graph: OpGraph) -> frozenset[str]:
    """The parameter placeholders of the region: expert weights and the router."""
    region = routed_region(graph)
    return frozenset(n.name for n in graph.params() if n.name in region)


def is_routed_expert_param(n: OpNode) -> bool:
    """An expert weight ([E, h, f]: an ``expert`` dim among three or more dims), not the router."""
    return n.out is not None and "expert" in n.out.dim_roles and len(n.out.shape) >= 3


def _within(module: str, root: str) -> bool:
    return module == root or module.startswith(root + ".")


def _parent(module: str) -> str:
    return module.rpartition(".")[0]


def _child_of(module: str, root: str) -> str:
    """The child of ``root`` that ``module`` lies in ('' when it is ``root`` itself)."""
    if module == root:
        return ""
    rest = module[len(root) + 1:] if root else module
    return (root + "." if root else "") + rest.split(".", 1)[0]


def _region(graph: OpGraph) -> frozenset[str]:
    params = graph.params()
    experts = [n for n in params if is_routed_expert_param(n)]
    if not experts:
        return frozenset()
    expert_module = experts[0].module
    count = experts[0].out.shape[experts[0].out.dim_roles.index("expert")]  # type: ignore[union-attr]  # a param has its tensor
    moe = _parent(expert_module) if "." in expert_module else expert_module
    owners: dict[str, list[OpNode]] = {}
    for n in params:
        if _within(n.module, moe) and n.module != moe:
            owners.setdefault(_child_of(n.module, moe), []).append(n)
    routed_children = {_child_of(expert_module, moe)} if expert_module != moe else set()
    routed_children |= {c for c, ps in owners.items()
                        if all(p.out is not None and len(p.out.shape) == 2 and count in p.out.shape for p in ps)}
    excluded = set(owners) - routed_children
    region = {n.name for n in params if any(_within(n.module, c) for c in routed_children)}
    for n in graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        inside = _within(n.module, moe) and not any(_within(n.module, c) for c in excluded)
        orphan = not n.module and bool(n.inputs) and all(r.node in region for r in n.inputs)
        if inside or orphan:
            region.add(n.name)
    return frozenset(region)
