"""Rank layout of plans onto the hardware order."""
from autoplan.axes import DENSE_DP, EXPERT_DP, EXPERT_TP
from autoplan.mesh import Mesh
from autoplan.plan import Plan


def test_tp_innermost_groups_are_consecutive():
    mesh = Mesh.of(Plan.parse("tp=8,pp=4,order=tp-cp-ep-dp-pp", num_gpus=64))
    assert mesh.group("tp", 0) == tuple(range(8))
    assert mesh.group("tp", 13) == tuple(range(8, 16))
    # dp is next: stride 8, pp outermost: stride 16
    assert mesh.group("dp", 0) == (0, 8)
    assert mesh.group("pp", 0) == (0, 16, 32, 48)
    assert len(mesh.groups("tp")) == 8 and len(mesh.groups("pp")) == 16


def test_order_changes_groups():
    mesh = Mesh.of(Plan.parse("tp=8,pp=2,order=pp-tp-cp-ep-dp", num_gpus=32))
    assert mesh.group("pp", 0) == (0, 1)
    assert mesh.group("tp", 0) == tuple(range(0, 16, 2))


def test_ep_is_carved_out_of_dp():
    plan = Plan.parse("tp=2,ep=4,dp=8,order=tp-cp-ep-dp-pp", num_gpus=16)
    mesh = Mesh.of(plan)
    assert mesh.group("ep", 0) == (0, 2, 4, 6)
    assert mesh.group(DENSE_DP, 0) == (0, 2, 4, 6, 8, 10, 12, 14)   # dense gradients: all dp ranks
    assert mesh.group(EXPERT_DP, 0) == (0, 8)                        # expert gradients: dp/ep ranks
    assert mesh.group("dp", 0) == (0, 8)                             # the dp axis: dp/ep ranks
    for r in range(16):
        assert mesh.rank(mesh.coords(r)) == r


def test_folded_expert_mesh_is_megatron_cores():
    """tp2·pp2·dp4 with ep4·etp1 on 16 GPUs, worked by hand from Megatron-Core's two RankGenerators
    (parallel_state.py: attention ``RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1)``, experts
    ``RankGenerator(tp=1, ep=4, dp=2, pp=2, cp=1)``, order tp-cp-ep-dp-pp): a stage is 8
    consecutive ranks; attention tp stride 1, dp stride 2; experts ep stride 1, edp stride 4."""
    plan = Plan.parse("tp=2,pp=2,dp=4,ep=4,etp=1")
    mesh = Mesh.of(plan)
    assert plan.edp == 2
    assert mesh.groups("tp")[:2] == [(0, 1), (2, 3)]
    assert mesh.groups(DENSE_DP)[:2] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert mesh.groups("ep") == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert mesh.groups(EXPERT_DP)[:5] == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12)]
    assert mesh.groups(EXPERT_TP)[:2] == [(0,), (1,)]
    assert mesh.groups("pp")[:2] == [(0, 8), (1, 9)]
    assert mesh.expert is not None and mesh.expert.groups("pp") == mesh.groups("pp")


def test_folded_ep_spans_cp_ranks_and_etp():
    """cp2·dp2 with ep4·etp1: the EP group is the whole stage (cp folded into ep), edp 1, the
    dense gradients over cp·dp; with tp2·dp4, ep2·etp2 the expert grid is etp2 (0, 1), ep stride 2,
    edp stride 4 — the unfolded plan's groups, as folding with etp = tp and cp = 1 is."""
    mesh = Mesh.of(Plan.parse("cp=2,dp=2,ep=4,etp=1"))
    assert mesh.group("ep", 0) == (0, 1, 2, 3) and mesh.group(EXPERT_DP, 0) == (0,)
    assert mesh.group(DENSE_DP, 0) == (0, 1, 2, 3) and mesh.group("cp", 0) == (0, 1)
    folded, plain = Mesh.of(Plan.parse("tp=2,dp=4,ep=2,etp=2")), Mesh.of(Plan.parse("tp=2,dp=4,ep=2"))
    assert folded.group(EXPERT_TP, 0) == (0, 1) == plain.group(EXPERT_TP, 0)
    for name in ("ep", EXPERT_DP, DENSE_DP, "tp"):
        assert folded.groups(name) == plain.groups(name)


def test_unfolded_plans_have_no_expert_mesh():
    assert Mesh.of(Plan.parse("tp=2,ep=4,dp=8", num_gpus=16)).expert is None
