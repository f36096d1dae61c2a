"""Each DTensor-internal wrapper, and the strategy enumeration over a traced graph."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.frontend import dtensor_strategies as ds

aten = torch.ops.aten


def test_planning_mesh_needs_no_process_group():
    mesh = ds.planning_mesh()
    assert mesh.size() == 2 and mesh.mesh_dim_names == ("tp",)
    assert not torch.distributed.is_initialized()


def test_placement_names_round_trip():
    for name in ("R", "S(0)", "S(3)", "P"):
        assert ds.placement_name(ds.placement(name)) == name
    from torch.distributed.tensor.placement_types import Partial
    assert ds.placement_name(Partial("avg")) is None and ds.placement_name(Partial("max")) is None


def test_single_dim_rules_of_mm_include_megatron_patterns():
    meta = (ds.tensor_meta(torch.empty(8, 4, device="meta")), ds.tensor_meta(torch.empty(4, 6, device="meta")))
    rules = [[ds.placement_name(p) for p in r] for r in ds.single_dim_rules(aten.mm.default, meta, {})]
    assert ["S(1)", "R", "S(1)"] in rules      # column parallel: out S(1) <- x R, w S(1)
    assert ["P", "S(1)", "S(0)"] in rules      # row parallel: out P <- x S(1), w S(0)


def test_registry_strategy_follows_given_placements():
    t = torch.empty(1, 8, 6, device="meta")
    arg = ds.op_strategy_input(t, ["R", "S(1)", "S(2)"])
    result = ds.registry_strategy(aten.view.default, (arg, [8, 6]), {})
    pairs = ds.strategies_from_registry_result(result, 1)
    assert (("S(1)",), ("S(0)",)) in pairs and (("S(2)",), ("S(1)",)) in pairs and (("R",), ("R",)) in pairs


def test_has_rules():
    assert ds.has_single_dim_rules(aten.add.Tensor) and not ds.has_registry_strategy(aten.add.Tensor)
    assert ds.has_registry_strategy(aten._scaled_dot_product_flash_attention.default)


def test_candidates():
    with FakeTensorMode():
        x = torch.empty(1, 4, 3)
        ids = torch.empty(4, 2, dtype=torch.long)
    assert ds.candidates(x, partial=True) == ["R", "S(1)", "S(2)", "P"]
    assert ds.candidates(ids, partial=True) == ["R", "S(0)", "S(1)"]       # no partial integers


def _traced(fn, *shapes):
    with FakeTensorMode():
        args = [torch.empty(s) for s in shapes]
    return make_fx(fn)(*args)


def test_enumerate_linear_then_gelu():
    gm = _traced(lambda x, w: torch.nn.functional.gelu(x @ w), (16, 8), (8, 32))
    table = ds.enumerate_strategies(gm, partial_inputs=set())
    mm = table.strategies["mm"]
    assert "S(1)<-R,S(1)" in [s.name for s in mm] and "P<-S(1),S(0)" in [s.name for s in mm]
    gelu = [s.name for s in table.strategies["gelu"]]
    assert gelu == sorted(set(gelu), key=gelu.index) and "S(1)<-S(1)" in gelu and "R<-R" in gelu
    assert "P<-P" not in gelu                  # gelu is not linear
    assert not table.fallbacks


def test_fallback_for_unregistered_pointwise_op():
    gm = _traced(lambda x, y: torch.ops.aten.floor_divide(x, y), (4, 6), (6,))
    table = ds.enumerate_strategies(gm, partial_inputs=set())
    assert table.fallbacks == {"aten.floor_divide.default"}
    assert {s.name for s in table.strategies["floor_divide"]} == {"R<-R,R", "S(0)<-S(0),R", "S(1)<-S(1),S(0)"}


def test_no_strategy_depends_on_tp_degree():
    """Shards of odd-sized dims remain (the search filters by divisibility); size-1 dims never shard."""
    gm = _traced(lambda x: x * 2, (1, 3, 8))
    names = {s.name for s in ds.enumerate_strategies(gm, set()).strategies["mul"]}
    assert "S(1)<-S(1)" in names and "S(0)<-S(0)" not in names


def test_bias_free_layer_norm_backward_keeps_its_sequence_sharded_rule():
    """Without a bias, native_layer_norm_backward returns no bias gradient; DTensor's rule
    leaves that output unplaced, and the rule must still be offered (Megatron SP runs it)."""
    def fn(x, w, g):
        out, mean, rstd = aten.native_layer_norm(x, [8], w, None, 1e-5)
        return aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, None, [True, True, False])
    gm = _traced(fn, (16, 4, 8), (8,), (16, 4, 8))
    names = [s.name for s in ds.enumerate_strategies(gm, partial_inputs=set()).strategies["native_layer_norm_backward"]]
    assert "S(0),P,-<-S(0),S(0),S(0),S(0),R" in names, names
