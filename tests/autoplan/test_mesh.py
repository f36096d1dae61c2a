"""Rank layout of plans onto the hardware order."""
from autoplan.axes import DENSE_DP, EXPERT_DP
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
