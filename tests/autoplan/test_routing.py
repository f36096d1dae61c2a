"""autoplan.routing: the routed-expert region of a traced MoE block, which the block ILP leaves at
the engine's layout and ``cost.ep`` prices."""
from __future__ import annotations

import topologies
from autoplan.cost import EstimateOptions, Estimator
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.routing import routed_params, routed_region

SPEC = ("moe:layers=2,hidden=256,heads=4,kv_heads=2,vocab=128,experts=8,topk=2,moe_ffn=128,shared_experts=1,"
        "dense_layers=1")


def test_the_region_is_router_dispatch_experts_and_combine_not_the_shared_expert(traced):
    model = traced(SPEC, seq=256)
    graph = model.block("moe0").graph
    region = routed_region(graph)
    modules = {graph.node(n).module for n in region}
    assert {"moe", "moe.router", "moe.routed"} <= modules
    assert not any(m.startswith(("moe.shared", "attention")) or "norm" in m for m in modules)
    params = {graph.node(n).module for n in routed_params(graph)}
    assert params == {"moe.router", "moe.routed"}
    assert routed_region(model.block("dense0").graph) == frozenset()
    # the backward sum of the two expert-GEMM input gradients has no module but is routed
    assert any(not graph.node(n).module for n in region)


def test_the_ilp_keeps_the_region_token_sharded_and_prices_none_of_it(traced):
    """Under SP every routed tensor with a token dim is sequence-sharded as the residual stream is:
    no tp collective moves one between routed ops (only where the shared expert, outside the
    region, reads the layer's input), and the expert weights and the router stay whole."""
    model = traced(SPEC, seq=256)
    est = Estimator(model, topologies.load("h100x8"), EstimateOptions())
    plan = Plan(tp=2, dp=4, ep=4)
    graph = model.block("moe0").graph
    bs = est.layouts.sharding("moe0", graph, plan, "none", Mesh.of(plan))
    region = routed_region(graph)
    read_outside = {r.node for n in graph.nodes if n.name not in region and n.op != "output" for r in n.inputs}
    moved = {c.tensor.split(":", 1)[1].split(" ")[0] for c in bs.collectives}
    assert moved & region <= read_outside
    assert all(bs.placements[n] == "R" for n in routed_params(graph))
