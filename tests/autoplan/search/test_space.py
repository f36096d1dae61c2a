"""search/space.py: the cp algorithms and USP splits the search enumerates."""
from __future__ import annotations

import topologies
from autoplan.ir import ModelInfo
from autoplan.search.space import cp_splits, enumerate_meshes


def test_cp_splits_inside_one_domain_are_ring_ulysses_and_the_rules_usp():
    assert cp_splits(1, 32, spans_domains=False) == [("ring", 0)]
    assert cp_splits(8, 32, spans_domains=False) == [("ring", 0), ("ulysses", 0), ("usp", 0)]
    # 4 heads per rank: Ulysses over 8 cannot split them, ring only
    assert cp_splits(8, 4, spans_domains=False) == [("ring", 0)]


def test_cp_splits_across_domains_add_every_explicit_usp_split_the_heads_allow():
    assert cp_splits(16, 32, spans_domains=True) == [("ring", 0), ("ulysses", 0), ("usp", 0),
                                                     ("usp", 2), ("usp", 4), ("usp", 8)]
    # 8 heads per tp rank: Ulysses over 16 and the rule's usp (checked at cp) drop out, u ≤ 8 stay
    assert cp_splits(16, 8, spans_domains=True) == [("ring", 0), ("usp", 2), ("usp", 4), ("usp", 8)]


def test_enumerated_usp_splits_keep_ulysses_inside_the_nvlink_domain():
    info = ModelInfo("llama3-8b", heads=32, kv_heads=8, hidden=4096, head_dim=128)
    cluster = topologies.load("a100x16")
    meshes, _ = enumerate_meshes(info, 32, cluster, seq=65536, global_batch=1, zero_levels=(1,))
    usp = sorted({(m.tp, m.ulysses) for m in meshes if m.cp == 16 and m.cp_algo == "usp"})
    # 16 ranks over 2 nodes of 8: explicit splits 2, 4, 8 (16 would leave the node), the rule's (0)
    assert usp == [(1, 0), (1, 2), (1, 4), (1, 8)]


def test_moe_mesh_overlaps_its_transfers_only_where_megatron_core_can():
    """Combined 1F1B (``ep_overlap``) wherever pp = 1 or interleaved, but not beside full or op
    recomputation of any stage, which TransformerConfig refuses; the dispatcher is DeepEP's."""
    from autoplan.search.space import MeshChoice
    mesh = MeshChoice(tp=1, cp=1, ep=8, pp=2, dp=8, zero=1, sp=False, cp_algo="ring",
                      order=("tp", "cp", "ep", "dp", "pp"))
    cases = {((), 2): True, ((), 1): False, (("selective", "none"), 2): True,
             (("none", "full"), 2): False, (("op",), 2): False, (("full:2",), 2): False}
    for (recompute, vpp), overlap in cases.items():
        inner = {"vpp": vpp} | ({"recompute": recompute} if recompute else {})
        plan = mesh.plan(**inner)
        assert (plan.ep_overlap, plan.dispatcher) == (overlap, "deepep"), (recompute, vpp)


def test_recompute_chosen_after_the_mesh_drops_combined_1f1b_where_megatron_refuses_it():
    from autoplan.search.space import MeshChoice, recomputed
    plan = MeshChoice(tp=1, cp=1, ep=8, pp=1, dp=8, zero=1, sp=False, cp_algo="ring",
                      order=("tp", "cp", "ep", "dp", "pp")).plan(mbs=1, recompute=("none",))
    assert plan.ep_overlap
    assert [recomputed(plan, (r,)).ep_overlap for r in ("none", "selective", "op", "full", "full:1")] == \
        [True, True, False, False, False]
    assert recomputed(plan, ("full",)).recompute == ("full",)


def test_partial_op_recompute_also_drops_combined_1f1b():
    """op:N runs as full recomputation in Megatron-LM (every layer, warned), which the overlap refuses."""
    from autoplan.search.space import MeshChoice, recomputed
    plan = MeshChoice(tp=1, cp=1, ep=8, pp=1, dp=8, zero=1, sp=False, cp_algo="ring",
                      order=("tp", "cp", "ep", "dp", "pp")).plan(mbs=1, recompute=("none",))
    assert not recomputed(plan, ("op:3",)).ep_overlap and recomputed(plan, ("selective",)).ep_overlap
