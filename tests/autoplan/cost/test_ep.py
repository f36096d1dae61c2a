"""cost/ep.py against numbers worked by hand: the MoE dispatch and combine all-to-alls.

The model is a traced MoE of one dense and one MoE layer (h = 512, 8 experts, top-2) at s = 1024.
ep.py's docstring: per MoE layer and pass, 2 all-to-alls (dispatch, combine), each rank sending
b·(s/cp)/(tp if SP)·topk·h·2 bytes, all on the critical path.  The α–β all-to-all of
costmodels/collectives.py is written out below with h100x64's links read from the cluster.
"""
from __future__ import annotations

import pytest

import topologies
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.ep import ep_cost
from autoplan.cost.prices import Prices
from autoplan.cost.types import AxisCost, EstimateOptions
from autoplan.mesh import Mesh
from autoplan.plan import Plan

SPEC = "moe:layers=2,hidden=512,heads=8,kv_heads=4,vocab=128,experts=8,topk=2,moe_ffn=256,ffn=1024,dense_layers=1"
S, H, TOPK, BF16 = 1024, 512, 2, 2

CLUSTER = topologies.load("h100x64")


@pytest.fixture(scope="module")
def model(traced):
    return traced(SPEC, seq=S)


# ---- the call under test, in one place (its signature is being reshaped) -------------------------

def _ep(model, plan: Plan, kind: str = "moe0") -> AxisCost:
    graph = model.block(kind).graph
    ctx = PlanContext(plan, Mesh.of(plan), Prices(CLUSTER), EstimateOptions(), model.model, model.seq_len,
                      model.model.hidden, activation_bytes(model.blocks[0].graph))
    return ep_cost(ctx, graph)


# ---- α–β by hand (costmodels/collectives.py: all_to_all, PXN) -------------------------------------

C = CLUSTER
B_RING = C.gpu.nvlink_bw * C.nvlink_efficiency                     # 369.9 GB/s
B_NET = C.nics_per_node * C.nic_bw * C.nic_efficiency / C.gpus_per_node    # 47 GB/s: 8 GPUs on 8 NICs
A0, A_NVL, A_RAIL = C.launch_latency, C.nvlink_latency, C.rail_latency
assert not C.sharp and C.num_pods == 1 and C.num_gpus <= C.leaf_size      # one rail group: α_L = rail


def all_to_all(s, n, m=1):
    """n ranks in m NVLink domains, k = n/m each: NVLink carries (k−1)/n of S, the NICs (n−k)/n."""
    k = n / m
    return max((k - 1) / n * s / B_RING, (n - k) / n * s / B_NET) + A0 + (k - 1) * A_NVL + (m - 1) * A_RAIL


def _check(cost: AxisCost, nbytes: float, t_one: float) -> None:
    assert cost.exposed_fwd_s == cost.exposed_bwd_s == pytest.approx(2 * t_one, rel=1e-12)
    assert [(c.axis, c.kind, c.nbytes, c.calls, c.phase, c.purpose) for c in cost.comms] == \
        [("ep", "all_to_all", nbytes, 2, "forward", "moe"), ("ep", "all_to_all", nbytes, 2, "backward", "moe")]
    assert all(c.seconds == c.exposed_s == pytest.approx(2 * t_one, rel=1e-12) for c in cost.comms)


def test_no_expert_parallelism_or_no_experts_costs_nothing(model):
    assert model.model.topk == TOPK
    assert _ep(model, Plan(dp=8)) == AxisCost()
    assert _ep(model, Plan(dp=8, ep=8), kind="dense0") == AxisCost()


def test_ep8_in_a_node_two_all_to_alls_per_pass(model):
    nbytes = S * TOPK * H * BF16                        # 2 MiB per rank per all-to-all
    t = 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL
    _check(_ep(model, Plan(dp=8, ep=8)), nbytes, t)


def test_sequence_parallel_tp_ranks_dispatch_their_own_shard_on_a_strided_group(model):
    # tp 2 inside: ep group {0, 2, …, 14} spans 2 nodes, 4 GPUs each
    nbytes = S / 2 * TOPK * H * BF16
    t = max(3 / 8 * nbytes / B_RING, 4 / 8 * nbytes / B_NET) + A0 + 3 * A_NVL + A_RAIL
    _check(_ep(model, Plan(tp=2, dp=8, ep=8)), nbytes, t)
    # without SP every tp rank dispatches all s tokens
    nbytes = S * TOPK * H * BF16
    t = max(3 / 8 * nbytes / B_RING, 4 / 8 * nbytes / B_NET) + A0 + 3 * A_NVL + A_RAIL
    _check(_ep(model, Plan(tp=2, dp=8, ep=8, sp=False)), nbytes, t)


def test_context_parallel_ranks_dispatch_s_over_cp_tokens_and_mbs_scales(model):
    # cp 2 inside ep: group {0, 2, 4, 6}, one node
    nbytes = 2 * S / 2 * TOPK * H * BF16
    _check(_ep(model, Plan(cp=2, dp=4, ep=4, mbs=2)), nbytes, 3 / 4 * nbytes / B_RING + A0 + 3 * A_NVL)


def test_dispatch_sends_the_element_size_the_trace_records(model, traced):
    """An fp32 trace's hidden states are 4 bytes an element (``ir.TensorInfo.dtype``): each
    all-to-all moves twice the bf16 trace's bytes."""
    fp32 = traced(SPEC, seq=S, dtype="fp32")
    assert activation_bytes(model.block("moe0").graph) == BF16
    assert activation_bytes(fp32.block("moe0").graph) == 4
    nbytes = S * TOPK * H * 4
    _check(_ep(fp32, Plan(dp=8, ep=8)), nbytes, 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL)


def test_ep16_across_two_nodes_is_nic_bound(model):
    nbytes = S * TOPK * H * BF16
    # NVLink 7/16 · 2 MiB / 369.9 GB/s = 2.5 µs; NICs 8/16 · 2 MiB / 47 GB/s = 22.3 µs
    t = 8 / 16 * nbytes / B_NET + A0 + 7 * A_NVL + A_RAIL
    assert t == pytest.approx(all_to_all(nbytes, 16, 2))
    _check(_ep(model, Plan(dp=16, ep=16)), nbytes, t)


def test_folded_ep_dispatches_over_the_expert_meshs_ranks(model):
    """MoE parallel folding (etp=1): EP drawn from a stage's tp·dp ranks, consecutive (Megatron-
    Core's expert grid etp-ep-edp): tp2·dp4 ep8 is ranks 0…7, one node; tp2·dp8 ep16 ranks 0…15,
    two nodes.  Each rank dispatches its own SP shard, s/tp tokens (the same bytes as unfolded)."""
    nbytes = S / 2 * TOPK * H * BF16
    _check(_ep(model, Plan(tp=2, dp=4, ep=8, etp=1)), nbytes, 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL)
    _check(_ep(model, Plan(tp=2, dp=8, ep=16, etp=1)), nbytes, all_to_all(nbytes, 16, 2))


def test_folded_experts_are_split_over_etp_and_ep(model):
    """A GPU holds 1/(etp·ep) of every expert weight under folding, whatever the tp layout of the
    block: E·3·h·f elements (SwiGLU: gate, up, down) and the E·h router (the trace gives it the
    expert dim, so it is counted with the experts as unfolded plans count it) over etp·ep ranks."""
    from autoplan.cost import EstimateOptions, Estimator

    est = Estimator(model, topologies.load("h100x16"), EstimateOptions())
    total = 8 * 3 * H * 256 + 8 * H
    for plan, shards in ((Plan(tp=2, dp=8, ep=8, etp=1), 8), (Plan(tp=2, dp=8, ep=4, etp=2), 8),
                         (Plan(tp=2, dp=8, ep=16, etp=1), 16)):
        assert est.part("moe0", plan, "none", Mesh.of(plan)).expert_numel == total // shards
