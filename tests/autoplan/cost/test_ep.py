"""cost/ep.py and costmodels/dispatch.py against numbers worked by hand: the routed experts as an
engine runs them (router, permute, dispatch, grouped GEMMs, combine), per micro-batch and GPU.

The model is a traced MoE of one dense and one MoE layer (h = 512, 8 experts, top-2, expert ffn
256) at s = 1024; a 16-expert top-4 one for the transfers across nodes.  ep.py's docstring: each
GPU routes T = mbs·s/(cp·tp) tokens; per MoE layer and pass one dispatch and one combine, at the
busiest rank's load (``dispatch.busiest_load``); the all-to-all dispatcher sends T·k rows of h·2
bytes, DeepEP's once per target rank and once per target node.  The α–β all-to-all of
costmodels/collectives.py is written out below with h100x64's links read from the cluster.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import pytest

import topologies
from autoplan.cost import ep
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.ep import ep_cost
from autoplan.cost.prices import Prices
from autoplan.cost.types import AxisCost, EstimateOptions
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels import dispatch

SPEC = "moe:layers=2,hidden=512,heads=8,kv_heads=4,vocab=128,experts=8,topk=2,moe_ffn=256,ffn=1024,dense_layers=1"
SPEC16 = "moe:layers=2,hidden=512,heads=8,kv_heads=4,vocab=128,experts=16,topk=4,moe_ffn=256,ffn=1024,dense_layers=1"
S, H, F, TOPK, BF16 = 1024, 512, 256, 2, 2

CLUSTER = topologies.load("h100x64")


@pytest.fixture(scope="module")
def model(traced):
    return traced(SPEC, seq=S)


@pytest.fixture(scope="module")
def model16(traced):
    return traced(SPEC16, seq=S)


def _ctx(model, plan: Plan, prices: Prices | None = None) -> PlanContext:
    return PlanContext(plan, Mesh.of(plan), prices or Prices(CLUSTER), EstimateOptions(), model.model,
                       model.seq_len, model.model.hidden, activation_bytes(model.blocks[0].graph))


def _ep(model, plan: Plan, kind: str = "moe0", recompute: str = "none") -> ep.RoutedCost:
    return ep_cost(_ctx(model, plan), model.block(kind).graph, recompute)


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


def load(rows: float, ep_size: int) -> float:
    """max/mean rows of the busiest of ep ranks: 1 + z·√((1 − 1/ep)/rows), z by Blom."""
    z = NormalDist().inv_cdf((ep_size - 0.375) / (ep_size + 0.25))
    return 1 + z * math.sqrt((1 - 1 / ep_size) / rows)


def _check(cost: AxisCost, nbytes: float, t_one: float, purpose: str = "moe dispatch+combine (alltoall)") -> None:
    assert cost.exposed_fwd_s == cost.exposed_bwd_s == pytest.approx(2 * t_one, rel=1e-12)
    assert [(c.axis, c.kind, c.calls, c.phase, c.purpose) for c in cost.comms] == \
        [("ep", "all_to_all", 2, "forward", purpose), ("ep", "all_to_all", 2, "backward", purpose)]
    assert all(c.nbytes == pytest.approx(nbytes, rel=1e-12) for c in cost.comms)
    assert all(c.seconds == c.exposed_s == pytest.approx(2 * t_one, rel=1e-12) for c in cost.comms)


# ---- where a token's experts sit, and the busiest rank ---------------------------------------------

def test_a_token_reaches_a_unit_unless_all_k_draws_miss_it():
    # 128 experts, top-8, a node of 32: 1 − C(96, 8)/C(128, 8)
    miss = math.comb(96, 8) / math.comb(128, 8)
    assert dispatch.unit_hit_probability(8, 128, 32) == pytest.approx(1 - miss)
    assert dispatch.units_hit(8, 128, 4) == pytest.approx(4 * (1 - miss))          # 3.63 of 4 nodes
    assert dispatch.units_hit(8, 128, 128) == pytest.approx(8)                        # one expert a unit: k
    assert dispatch.units_hit(8, 128, 1) == pytest.approx(1)


def test_group_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3: 256 experts in 8 groups, a token's 8 experts from its best 4 groups; a group
    per node of 32 experts: a node is reached only if its group is drawn (4/8), then unless the 8
    draws among the 128 experts of the 4 groups all miss its 32: at most 4 nodes."""
    p = 4 / 8 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert dispatch.unit_hit_probability(8, 256, 32, groups=8, topk_groups=4) == pytest.approx(p)
    assert dispatch.units_hit(8, 256, 8, groups=8, topk_groups=4) == pytest.approx(8 * p) and 8 * p < 4
    # a unit of two groups (64 experts, EP over 4 nodes): hypergeometric over its drawn groups
    two = sum(math.comb(2, j) * math.comb(6, 4 - j) / math.comb(8, 4)
              * (1 - math.comb(128 - 32 * j, 8) / math.comb(128, 8)) for j in (1, 2))
    assert dispatch.unit_hit_probability(8, 256, 64, groups=8, topk_groups=4) == pytest.approx(two)


def test_busiest_rank_load_is_the_expected_maximum_of_binomial_rows():
    assert dispatch.busiest_load(16384, 32) == pytest.approx(load(16384, 32))
    assert 1.015 < dispatch.busiest_load(16384, 32) < 1.017          # Qwen3-235B's T·k on EP32: +1.6 %
    assert dispatch.busiest_load(16384, 1) == 1.0


# ---- the transfers ------------------------------------------------------------------------------

def test_no_expert_parallelism_or_no_experts_moves_nothing(model):
    assert model.model.topk == TOPK
    assert _ep(model, Plan(dp=8)).comm == AxisCost()
    assert _ep(model, Plan(dp=8, ep=8), kind="dense0") == ep.RoutedCost()


def test_ep8_in_a_node_alltoall_two_transfers_per_pass(model):
    nbytes = S * TOPK * H * BF16 * load(S * TOPK, 8)          # ~2 MiB per rank per transfer
    _check(_ep(model, Plan(dp=8, ep=8)).comm, nbytes, 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL)


def test_sequence_parallel_tp_ranks_dispatch_their_own_shard_on_a_strided_group(model):
    # tp 2 inside: ep group {0, 2, …, 14} spans 2 nodes, 4 GPUs each
    nbytes = S / 2 * TOPK * H * BF16 * load(S / 2 * TOPK, 8)
    t = max(3 / 8 * nbytes / B_RING, 4 / 8 * nbytes / B_NET) + A0 + 3 * A_NVL + A_RAIL
    cost = _ep(model, Plan(tp=2, dp=8, ep=8)).comm
    assert [c for c in cost.comms if c.axis == "ep"][0].seconds == pytest.approx(2 * t, rel=1e-12)


def test_without_sequence_parallelism_the_output_is_gathered_over_tp(model):
    cost = _ep(model, Plan(tp=2, dp=8, ep=8, sp=False)).comm
    gathers = [(c.kind, c.phase, c.nbytes) for c in cost.comms if c.purpose == "moe output (no SP)"]
    assert gathers == [("all_gather", "forward", S * H * BF16), ("reduce_scatter", "backward", S * H * BF16)]


def test_context_parallel_ranks_dispatch_s_over_cp_tokens_and_mbs_scales(model):
    # cp 2 inside ep: group {0, 2, 4, 6}, one node
    rows = 2 * S / 2 * TOPK
    nbytes = rows * H * BF16 * load(rows, 4)
    _check(_ep(model, Plan(cp=2, dp=4, ep=4, mbs=2)).comm, nbytes, 3 / 4 * nbytes / B_RING + A0 + 3 * A_NVL)


def test_dispatch_sends_the_element_size_the_trace_records(model, traced):
    """An fp32 trace's hidden states are 4 bytes an element (``ir.TensorInfo.dtype``): each
    transfer moves twice the bf16 trace's bytes."""
    fp32 = traced(SPEC, seq=S, dtype="fp32")
    assert activation_bytes(model.block("moe0").graph) == BF16
    assert activation_bytes(fp32.block("moe0").graph) == 4
    nbytes = S * TOPK * H * 4 * load(S * TOPK, 8)
    _check(_ep(fp32, Plan(dp=8, ep=8)).comm, nbytes, 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL)


def test_ep16_alltoall_across_two_nodes_is_nic_bound(model16):
    rows = S * 4
    nbytes = rows * H * BF16 * load(rows, 16)
    t = 8 / 16 * nbytes / B_NET + A0 + 7 * A_NVL + A_RAIL
    assert t == pytest.approx(all_to_all(nbytes, 16, 2))
    _check(_ep(model16, Plan(dp=16, ep=16)).comm, nbytes, t)


def test_deepep_in_a_node_sends_each_token_once_per_target_rank(model):
    """8 experts on EP8, top-2: a token reaches another given rank with 1 − C(7,2)/C(8,2) = 1/4,
    7 other ranks: 7/4 rows per token over NVLink instead of the all-to-all's 2 · 7/8."""
    rows = S * load(S * TOPK, 8)
    nvlink = rows * H * BF16 * 7 * (1 - math.comb(7, 2) / math.comb(8, 2))
    _check(_ep(model, Plan(dp=8, ep=8, dispatcher="deepep")).comm, nvlink, nvlink / B_RING + A0 + A_NVL,
           "moe dispatch+combine (deepep)")


def test_deepep_across_nodes_crosses_the_network_once_per_target_node(model16):
    """16 experts on EP16 over 2 nodes, top-4: a token reaches the other node (8 experts) unless its
    4 draws all miss it, C(8,4)/C(16,4); over NVLink it enters each of the 16 ranks it reaches
    (1 − C(15,4)/C(16,4) = 1/4 each).  The two hops are pipelined: the slower sets the time."""
    rows = S * load(S * 4, 16)
    network = rows * H * BF16 * (1 - math.comb(8, 4) / math.comb(16, 4))
    nvlink = rows * H * BF16 * 16 * (1 - math.comb(15, 4) / math.comb(16, 4))
    t = max(network / B_NET, nvlink / B_RING) + A0 + A_NVL + A_RAIL
    _check(_ep(model16, Plan(dp=16, ep=16, dispatcher="deepep")).comm, network + nvlink, t,
           "moe dispatch+combine (deepep)")


def test_folded_ep_dispatches_over_the_expert_meshs_ranks(model, model16):
    """MoE parallel folding (etp=1): EP drawn from a stage's tp·dp ranks, consecutive (Megatron-
    Core's expert grid etp-ep-edp): tp2·dp4 ep8 is ranks 0…7, one node; tp2·dp8 ep16 ranks 0…15,
    two nodes.  Each rank dispatches its own SP shard, s/tp tokens (the same bytes as unfolded)."""
    rows = S / 2 * TOPK
    nbytes = rows * H * BF16 * load(rows, 8)
    _check(_ep(model, Plan(tp=2, dp=4, ep=8, etp=1)).comm, nbytes, 7 / 8 * nbytes / B_RING + A0 + 7 * A_NVL)
    rows = S / 2 * 4
    nbytes = rows * H * BF16 * load(rows, 16)
    _check(_ep(model16, Plan(tp=2, dp=8, ep=16, etp=1)).comm, nbytes, all_to_all(nbytes, 16, 2))


def test_expert_tensor_parallelism_gathers_the_received_rows_over_etp(model):
    """tp2·dp8 ep4 etp2: the received T·k rows are all-gathered over the etp group (2 ranks) before
    the expert GEMMs and reduce-scattered after, forward and backward."""
    plan = Plan(tp=2, dp=8, ep=4, etp=2)
    rows = S / 2 * TOPK
    gathered = rows * load(rows, 4) * 2 * H * BF16
    etp = [(c.kind, c.phase, c.nbytes) for c in _ep(model, plan).comm.comms if c.purpose == "expert tp"]
    g = pytest.approx(gathered)
    assert etp == [("all_gather", "forward", g), ("reduce_scatter", "forward", g),
                   ("all_gather", "backward", g), ("reduce_scatter", "backward", g)]


def test_full_recomputation_reruns_the_forward_and_its_transfers(model):
    plan = Plan(dp=8, ep=8)
    once, twice = _ep(model, plan), _ep(model, plan, recompute="full")
    assert twice.backward_s == pytest.approx(once.backward_s + once.forward_s)
    assert twice.recompute_s == pytest.approx(once.forward_s)
    assert twice.comm.exposed_bwd_s == pytest.approx(once.comm.exposed_bwd_s + once.comm.exposed_fwd_s)


# ---- the grouped GEMMs and the launches ------------------------------------------------------------

def test_grouped_gemms_run_each_local_expert_on_its_own_tokens(model):
    """ep 4: 2 local experts, each on T·k·ep/E = 1024·2·4/8 = 1024 rows (times the busiest load);
    SwiGLU: gate and up (h → f), down (f → h); a weight gradient accumulates into the fp32 main
    gradient (8 bytes per weight)."""
    plan = Plan(dp=4, ep=4)
    ctx = _ctx(model, plan)
    shapes = ep.expert_shapes(model.block("moe0").graph)
    assert sorted(shapes.gemms) == [(F, H), (F, H), (H, F)] and shapes.experts == 8
    rows = S * TOPK * load(S * TOPK, 4)
    m = rows * 4 / 8
    price = ctx.prices.op_seconds
    fwd = sum(price("gemm", 2 * m * n * k, (m * k + k * n + m * n) * 2, (m, n, k)) for n, k in shapes.gemms)
    wgrad = sum(price("gemm", 2 * m * n * k, (m * k + m * n) * 2 + k * n * 8, (k, n, m)) for n, k in shapes.gemms)
    f, _, w = ep._grouped_gemms(ctx, shapes, rows, 2)
    assert f == pytest.approx(2 * fwd) and w == pytest.approx(2 * wgrad)


def test_fewer_tokens_per_expert_run_at_lower_efficiency(model):
    """The same FLOPs on EP8 (1 expert, 2048 rows) and on EP1 with 8 experts of 256 rows: the
    smaller GEMMs are slower per FLOP (``gemm_half_dim`` on M)."""
    shapes = ep.expert_shapes(model.block("moe0").graph)
    wide = ep._grouped_gemms(_ctx(model, Plan(dp=8, ep=8)), shapes, S * TOPK, 2)[0]
    narrow = ep._grouped_gemms(_ctx(model, Plan(dp=8)), shapes, S * TOPK / 8, 2)[0]
    assert narrow > wide


def test_engine_launches_count_one_gemm_per_local_expert(model):
    from autoplan.cost import Estimator
    est = Estimator(model, topologies.load("h100x16"), EstimateOptions())
    graph = model.block("moe0").graph
    shapes = ep.expert_shapes(graph)
    counts = {}
    for ep_size in (1, 8):
        plan = Plan(dp=8, ep=ep_size)
        bs = est.layouts.sharding("moe0", graph, plan, "none", Mesh.of(plan))
        counts[ep_size] = ep.engine_launches(graph, shapes, ep_size, "none", bs)
    # 8 local experts at ep 1, one at ep 8: 7 fewer per expert GEMM forward, twice that backward
    assert counts[1][0] - counts[8][0] == 3 * 7 and counts[1][1] - counts[8][1] == 2 * 3 * 7


# ---- combined 1F1B ------------------------------------------------------------------------------

def test_paired_fraction_leaves_out_the_warm_up_forwards():
    # interleaved pp 8, vpp 4, m 128: rank 0 warms up 2·7 + 3·8 = 38 of 512 forwards, and the first
    assert ep.paired_fraction("interleaved", 8, 4, 128) == pytest.approx((512 - 38 - 1) / 512)
    assert ep.paired_fraction("1f1b", 1, 1, 4) == pytest.approx(3 / 4)


def test_a_pair_hides_the_transfers_under_the_other_compute_less_their_sms():
    # F = 3 (1 of it transfers), B = 5 (1): compute 6, pair max(6 + share·2, 2)
    f, b = ep.hide_paired([3.0], [5.0], [1.0], [1.0], 1.0)
    pair = 6 + ep.COMM_SM_SHARE * 2
    assert f[0] + b[0] == pytest.approx(pair) and f[0] - 3 == pytest.approx(b[0] - 5)
    # transfers longer than the compute: the pair lasts the transfers
    f, b = ep.hide_paired([1.5], [1.5], [1.0], [1.0], 1.0)
    assert f[0] + b[0] == pytest.approx(2.0)
    # half the pairs
    f, b = ep.hide_paired([3.0], [5.0], [1.0], [1.0], 0.5)
    assert f[0] + b[0] == pytest.approx(8 - 0.5 * (8 - pair))


def test_expert_weights_are_split_over_etp_and_ep_the_router_is_dense(model):
    """A GPU holds 1/(etp·ep) of every expert weight, whatever the tp layout of the block:
    E·3·h·f elements (SwiGLU: gate, up, down) over etp·ep ranks (etp = tp unfolded, Megatron-Core's
    default expert tensor parallelism); the E·h router is dense, replicated over tp."""
    from autoplan.cost import Estimator

    est = Estimator(model, topologies.load("h100x16"), EstimateOptions())
    experts = 8 * 3 * H * 256
    for plan, shards in ((Plan(tp=2, dp=8, ep=8, etp=1), 8), (Plan(tp=2, dp=8, ep=4, etp=2), 8),
                         (Plan(tp=2, dp=8, ep=16, etp=1), 16), (Plan(tp=2, dp=8, ep=4), 8), (Plan(dp=16), 1)):
        part = est.part("moe0", plan, "none", Mesh.of(plan))
        assert part.expert_numel == experts // shards
