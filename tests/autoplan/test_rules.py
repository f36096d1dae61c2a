"""rules.py against groups worked by hand and against brute-force enumeration of every group.

A group of an axis (stride s, size k) is {o + i·s}; it lies in one NVLink domain of D ranks iff its
first and last rank share r // D.  The hand cases below spell out the groups of a few meshes; the
property test enumerates every group with ``Mesh.groups`` and splits it into sub-groups as USP does,
which is what the O(domain) residue check of ``groups_inside`` must agree with.
"""
from __future__ import annotations

import random

import pytest

from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.rules import (
    GroupRule,
    first_crossing_group,
    groups_inside,
    nvlink_breaks,
    per_layer_groups,
    respects_nvlink,
    ulysses_and_ring,
)

AXES = ("tp", "cp", "ep", "dp", "pp")


def _mesh(order, **sizes) -> Mesh:
    return Mesh(tuple((a, sizes.get(a, 1)) for a in order))


def _rule(mesh: Mesh, axis: str, size: int | None = None) -> GroupRule:
    size = size or mesh.size(axis)
    return GroupRule(f"{axis}-inside-nvlink", axis, axis, size, mesh.stride(axis))


def _crossing(mesh: Mesh, axis: str, size: int, domain: int) -> list[tuple[int, ...]]:
    """Brute force: every (sub-)group of ``size`` consecutive members of a group of ``axis`` that
    leaves its domain, sorted by rank."""
    out = []
    for full in mesh.groups(axis):
        for i in range(0, len(full), size):
            sub = full[i:i + size]
            if sub[0] // domain != sub[-1] // domain:
                out.append(sub)
    return sorted(out)


# ---- ulysses_and_ring: the USP split worked by hand -------------------------------------------

@pytest.mark.parametrize("plan, domain, expected", [
    (Plan(cp=8, dp=1, cp_algo="ring"), 8, (1, 8)),
    (Plan(cp=8, dp=1, cp_algo="ulysses"), 8, (8, 1)),
    # cp innermost beside nothing: Ulysses over the 8 GPUs of the domain, ring across 2 domains
    (Plan(cp=16, cp_algo="usp"), 8, (8, 2)),
    # 2 tp ranks inside each cp step: 8 // 2 = 4 cp ranks fit a domain
    (Plan(tp=2, cp=8, cp_algo="usp"), 8, (4, 2)),
    # tp fills the domain: no room for Ulysses, ring only
    (Plan(tp=8, cp=4, cp_algo="usp"), 8, (1, 4)),
    # 8 does not divide 12 and 6 would put ranks 6..11 across two domains: 4 (0..3, 4..7, 8..11)
    (Plan(cp=12, cp_algo="usp"), 8, (4, 3)),
    # tp outside cp (cp stride 1, tp stride 12): as if tp were not there, 4
    (Plan(tp=2, cp=12, cp_algo="usp", order=("cp", "tp", "ep", "dp", "pp")), 8, (4, 3)),
    # ep (2) between tp (2) and cp: cp stride 4, 8 // (2·2) = 2 cp ranks fit
    (Plan(tp=2, cp=4, dp=2, ep=2, cp_algo="usp", order=("tp", "ep", "cp", "dp", "pp")), 8, (2, 2)),
    # an NVL72 domain: 72 // 4 = 18 ≥ 16, all of cp is Ulysses
    (Plan(tp=4, cp=16, cp_algo="usp"), 72, (16, 1)),
])
def test_ulysses_and_ring_split_worked_by_hand(plan, domain, expected):
    assert ulysses_and_ring(plan, Mesh.of(plan), domain) == expected


def test_usp_ulysses_groups_of_the_hand_cases_lie_in_one_domain():
    for plan, domain in ((Plan(cp=16, cp_algo="usp"), 8), (Plan(tp=2, cp=8, cp_algo="usp"), 8),
                         (Plan(tp=2, cp=4, dp=2, ep=2, cp_algo="usp", order=("tp", "ep", "cp", "dp", "pp")), 8)):
        mesh = Mesh.of(plan)
        u, _ = ulysses_and_ring(plan, mesh, domain)
        assert _crossing(mesh, "cp", u, domain) == []


# ---- per_layer_groups ---------------------------------------------------------------------------

def test_per_layer_groups_lists_tp_ep_and_ulysses_groups_with_their_strides():
    plan = Plan(tp=2, cp=2, dp=8, ep=4, cp_algo="usp")          # order tp-cp-ep-dp-pp
    mesh = Mesh.of(plan)                                        # strides tp 1, cp 2, ep 4
    got = per_layer_groups(plan, mesh, experts=8, nvlink_domain=8)
    assert got == [GroupRule("tp-inside-nvlink", "tp", "TP/SP", 2, 1),
                   GroupRule("ep-inside-nvlink", "ep", "EP all-to-all", 4, 4),
                   GroupRule("cp-inside-nvlink", "cp", "Ulysses all-to-all", 2, 2)]
    # a dense model has no expert all-to-all; ring attention has no per-layer all-to-all
    assert [g.axis for g in per_layer_groups(plan, mesh, experts=0, nvlink_domain=8)] == ["tp", "cp"]
    ring = Plan(tp=2, cp=2, dp=8, ep=4, cp_algo="ring")
    assert [g.axis for g in per_layer_groups(ring, Mesh.of(ring), experts=8, nvlink_domain=8)] == ["tp", "ep"]
    # USP with no room for Ulysses (tp fills the domain): ring only, no cp rule
    full = Plan(tp=8, cp=2, cp_algo="usp")
    assert [g.axis for g in per_layer_groups(full, Mesh.of(full), experts=0, nvlink_domain=8)] == ["tp"]
    assert per_layer_groups(Plan(dp=8), Mesh.of(Plan(dp=8)), experts=8, nvlink_domain=8) == []


# ---- groups_inside / first_crossing_group on meshes worked by hand ------------------------------

def test_tp4_groups_lie_in_their_domains():
    mesh = _mesh(AXES, tp=4, dp=4)                 # {0..3}, {4..7}, {8..11}, {12..15}
    assert groups_inside(mesh, _rule(mesh, "tp"), 8)
    assert first_crossing_group(mesh, _rule(mesh, "tp"), 8) is None


def test_tp6_second_group_crosses_into_the_next_domain():
    mesh = _mesh(AXES, tp=6, dp=2)                 # {0..5} in domain 0; {6..11}: 6, 7 | 8..11
    assert not groups_inside(mesh, _rule(mesh, "tp"), 8)
    assert first_crossing_group(mesh, _rule(mesh, "tp"), 8) == (6, 7, 8, 9, 10, 11)
    # on NVL72 domains every group of 6 fits (72 = 12·6)
    assert groups_inside(_mesh(AXES, tp=6, dp=24), _rule(_mesh(AXES, tp=6, dp=24), "tp"), 72)


def test_tp3_third_group_crosses():
    mesh = _mesh(AXES, tp=3, dp=4)                 # {0,1,2}, {3,4,5}, {6,7,8}: 6, 7 | 8
    assert first_crossing_group(mesh, _rule(mesh, "tp"), 8) == (6, 7, 8)


def test_tp_outside_dp_is_strided_across_domains():
    mesh = _mesh(("dp", "tp", "cp", "ep", "pp"), tp=2, dp=8)     # tp stride 8: {i, i + 8}
    assert not groups_inside(mesh, _rule(mesh, "tp"), 8)
    assert first_crossing_group(mesh, _rule(mesh, "tp"), 8) == (0, 8)
    assert groups_inside(mesh, _rule(mesh, "tp"), 16)             # one 16-GPU domain holds both


def test_ep_group_strided_by_tp_crosses():
    mesh = _mesh(AXES, tp=4, ep=4)                 # ep stride 4: {0, 4, 8, 12}
    assert first_crossing_group(mesh, _rule(mesh, "ep"), 8) == (0, 4, 8, 12)
    mesh = _mesh(AXES, tp=2, ep=4)                 # ep stride 2: {0, 2, 4, 6}, {1, 3, 5, 7}
    assert groups_inside(mesh, _rule(mesh, "ep"), 8)


def test_usp_sub_groups_inside_though_the_whole_cp_group_crosses():
    mesh = _mesh(AXES, tp=2, cp=8)                 # cp stride 2: {0, 2, …, 14}
    assert not groups_inside(mesh, _rule(mesh, "cp"), 8)
    # Ulysses sub-groups of 4: {0,2,4,6}, {8,…,14}, {1,3,5,7}, {9,…,15}
    assert groups_inside(mesh, _rule(mesh, "cp", 4), 8)
    assert first_crossing_group(mesh, _rule(mesh, "cp", 4), 8) is None


def test_domain_residues_across_several_outer_axes():
    # tp 2 (stride 1), dp 3 (stride 2), pp 2 (stride 6): offsets of tp groups 0, 2, 4, 6, 8, 10 —
    # all even, so every pair {o, o+1} stays in a domain of 4
    mesh = _mesh(("tp", "dp", "pp", "cp", "ep"), tp=2, dp=3, pp=2)
    assert groups_inside(mesh, _rule(mesh, "tp"), 4)
    # dp groups {0, 2, 4}: 0, 2 | 4 → crosses a domain of 4, fits one of 6? {6, 8, 10}: 6..11 yes
    assert first_crossing_group(mesh, _rule(mesh, "dp"), 4) == (0, 2, 4)
    assert groups_inside(mesh, _rule(mesh, "dp"), 6)


# ---- nvlink_breaks / respects_nvlink --------------------------------------------------------------

def test_nvlink_breaks_names_each_broken_rule_and_its_first_group():
    plan = Plan(tp=4, dp=8, ep=4)                                # ep stride 4
    breaks = nvlink_breaks(plan, Mesh.of(plan), experts=8, nvlink_domain=8)
    assert [(g.rule, bad) for g, bad in breaks] == [("ep-inside-nvlink", (0, 4, 8, 12))]
    assert not respects_nvlink(plan, experts=8, nvlink_domain=8)
    assert respects_nvlink(plan, experts=0, nvlink_domain=8)     # dense: no expert all-to-all
    uly = Plan(tp=8, cp=2, cp_algo="ulysses")                    # cp stride 8: {0, 8}
    assert [(g.rule, bad) for g, bad in nvlink_breaks(uly, Mesh.of(uly), experts=0, nvlink_domain=8)] == \
        [("cp-inside-nvlink", (0, 8))]
    assert respects_nvlink(Plan(tp=8, cp=2, cp_algo="ring"), experts=0, nvlink_domain=8)
    assert respects_nvlink(Plan(tp=2, cp=8, cp_algo="usp"), experts=0, nvlink_domain=8)
    assert not respects_nvlink(Plan(tp=6, dp=2), experts=0, nvlink_domain=8)


# ---- the O(domain) check against brute force ------------------------------------------------------

def _random_meshes(seed: int, count: int):
    rng = random.Random(seed)
    sizes = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16)
    while count:
        order = list(AXES)
        rng.shuffle(order)
        mesh = _mesh(order, **{a: rng.choice(sizes) for a in AXES})
        if mesh.num_ranks <= 512:
            count -= 1
            yield mesh, rng.choice((4, 8, 16, 72))


def test_groups_inside_equals_brute_force_over_every_group_and_sub_group():
    checked = 0
    for mesh, domain in _random_meshes(0, 600):
        for axis, size in mesh.sizes:
            for sub in (d for d in range(2, size + 1) if size % d == 0):
                g = _rule(mesh, axis, sub)
                assert groups_inside(mesh, g, domain) == (not _crossing(mesh, axis, sub, domain)), (mesh, g, domain)
                checked += 1
    assert checked > 1000


def test_first_crossing_group_is_the_smallest_crossing_whole_group():
    for mesh, domain in _random_meshes(1, 300):
        for axis, size in mesh.sizes:
            if size > 1:
                bad = _crossing(mesh, axis, size, domain)
                assert first_crossing_group(mesh, _rule(mesh, axis), domain) == (bad[0] if bad else None)


def test_groups_inside_on_a_16k_rank_mesh_equals_brute_force():
    mesh = _mesh(AXES, tp=8, cp=2, dp=128, pp=8)                 # 16,384 ranks
    for axis, sub, domain in (("tp", 8, 8), ("cp", 2, 8), ("cp", 2, 16), ("tp", 4, 8)):
        assert groups_inside(mesh, _rule(mesh, axis, sub), domain) == (not _crossing(mesh, axis, sub, domain))


def test_first_crossing_usp_sub_group_is_the_one_with_the_smallest_rank():
    # dp 3 inside cp 6 (stride 3), tp outside: Ulysses 3 has stride 3 and is 7 ranks wide.
    # cp groups of tp rank 0: {0,3,…,15}, {1,4,…,16}, {2,5,…,17}; sub-groups {1,4,7} | {10,13,16} and
    # {2,5,8} | {11,14,17}: (10, 13, 16), (2, 5, 8) and (11, 14, 17) cross, the smallest is (2, 5, 8)
    plan = Plan(tp=2, dp=3, cp=6, cp_algo="usp", order=("dp", "cp", "tp", "ep", "pp"))
    mesh = Mesh.of(plan)
    assert _crossing(mesh, "cp", 3, 8)[:3] == [(2, 5, 8), (10, 13, 16), (11, 14, 17)]
    g = GroupRule("cp-inside-nvlink", "cp", "Ulysses all-to-all", 3, mesh.stride("cp"))
    assert first_crossing_group(mesh, g, 8) == (2, 5, 8)
    # the rule itself no longer picks that split: no Ulysses group of 2 or 3 (stride 3) fits
    assert ulysses_and_ring(plan, mesh, 8) == (1, 6)
    assert not _crossing(mesh, "cp", 1, 8)
    breaks = dict((g.axis, bad) for g, bad in nvlink_breaks(plan, mesh, experts=0, nvlink_domain=8))
    assert breaks["tp"] == (0, 18)                 # tp stride 18: whole groups, found in rank order
    assert "cp" not in breaks


def test_a_plans_own_usp_split_is_checked_and_its_smallest_crossing_group_named():
    # the same layout with ulysses=3 written in the plan: the rule check finds (2, 5, 8)
    plan = Plan(tp=2, dp=3, cp=6, cp_algo="usp", ulysses=3, order=("dp", "cp", "tp", "ep", "pp"))
    mesh = Mesh.of(plan)
    assert ulysses_and_ring(plan, mesh, 8) == (3, 2)
    breaks = dict((g.axis, bad) for g, bad in nvlink_breaks(plan, mesh, experts=0, nvlink_domain=8))
    assert breaks["cp"] == (2, 5, 8)
    # USP paper's 16 A800 (2 nodes of 8): u4r4 and u2r8 keep Ulysses inside a node, u16 would not
    for u, inside in ((2, True), (4, True), (8, True), (16, False)):
        p = Plan(cp=16, cp_algo="usp" if u < 16 else "ulysses", ulysses=u if u < 16 else 0)
        assert respects_nvlink(p, experts=0, nvlink_domain=8) == inside


def test_folded_ep_groups_from_their_real_ranks():
    """Qwen3-235B's cross-node layout tp2·pp8·dp16 ep32·etp1 on 8-GPU domains: a stage is 32
    consecutive ranks and its one EP group all of them (four domains), so the rule breaks there;
    intra-node EP8 folded over tp2·dp128 (EP group 0…7) keeps it; etp2 puts the EP group at
    stride 2 (0, 2, …, 14): two domains."""
    xnode = Plan.parse("tp=2,pp=8,vpp=4,dp=16,ep=32,etp=1")
    breaks = nvlink_breaks(xnode, Mesh.of(xnode), experts=128, nvlink_domain=8)
    assert [(g.rule, g.expert, bad) for g, bad in breaks] == [("ep-inside-nvlink", True, tuple(range(32)))]
    inode = Plan.parse("tp=2,dp=128,ep=8,etp=1")
    assert respects_nvlink(inode, experts=128, nvlink_domain=8)
    etp2 = Plan.parse("tp=2,dp=128,ep=8,etp=2")
    rules = per_layer_groups(etp2, Mesh.of(etp2), experts=128, nvlink_domain=8)
    assert [(g.rule, g.size, g.stride) for g in rules] == [("tp-inside-nvlink", 2, 1), ("ep-inside-nvlink", 8, 2),
                                                         ("etp-inside-nvlink", 2, 1)]
    assert first_crossing_group(Mesh.of(etp2), rules[1], 8) == tuple(range(0, 16, 2))
