"""cost/cp.py against numbers worked by hand: ring, Ulysses and USP context parallelism, and attention time.

The model is a traced Llama block small enough to follow: s = 4096 tokens, h = 512, a = 16 heads of
d = 32, a_kv = 8 KV heads, one causal flash-attention kernel per phase.  Expected values follow cp.py's
docstring (bytes per hop or all-to-all, hops per pass, the exposure algebra of a ring pass) with the
α–β formulas of costmodels/collectives.py written out below and h100x64's links read from the cluster.
"""
from __future__ import annotations

import pytest
import yaml

import topologies
from autoplan.cost.context import PlanContext, activation_bytes
from autoplan.cost.cp import attention_bytes, attention_seconds, cp_cost
from autoplan.cost.params import NOMINAL, Params
from autoplan.cost.prices import Prices
from autoplan.cost.types import AxisCost, EstimateOptions
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.compute import PROFILE_DIR

SPEC = "llama:layers=2,hidden=512,heads=16,kv_heads=8,ffn=1024,vocab=256"
S, H, A_KV, D = 4096, 512, 8, 32
BF16 = 2
TILE = 128                                    # FlashAttention's 128×128 tiles (opkinds.FLASH_TILE)

CLUSTER = topologies.load("h100x64")
with open(f"{PROFILE_DIR}/h100.yaml") as f:
    PROFILE = yaml.safe_load(f)


@pytest.fixture(scope="module")
def model(traced):
    return traced(SPEC, seq=S)


# ---- the calls under test, one place each (their signatures are being reshaped) -----------------

def _ctx(model, plan: Plan, params: Params = NOMINAL) -> PlanContext:
    return PlanContext(plan, Mesh.of(plan), Prices(CLUSTER, params=params), EstimateOptions(), model.model,
                       model.seq_len, model.model.hidden, activation_bytes(model.blocks[0].graph))


def _cp(model, plan: Plan, attention: tuple[float, float], graph=None, params: Params = NOMINAL) -> AxisCost:
    graph = model.blocks[0].graph if graph is None else graph
    return cp_cost(_ctx(model, plan, params), graph, attention)


def _attention(model, plan: Plan) -> tuple[float, float]:
    return attention_seconds(_ctx(model, plan), model.blocks[0].graph)


# ---- α–β by hand (costmodels/collectives.py) -----------------------------------------------------

C = CLUSTER
B_RING = C.gpu.nvlink_bw * C.nvlink_efficiency                     # 369.9 GB/s
B_NET = C.nics_per_node * C.nic_bw * C.nic_efficiency / C.gpus_per_node    # 47 GB/s: 8 GPUs on 8 NICs
A0, A_NVL, A_RAIL = C.launch_latency, C.nvlink_latency, C.rail_latency
assert not C.sharp and C.num_pods == 1 and C.num_gpus <= C.leaf_size      # one rail group: α_L = rail
LAUNCH = PROFILE["overhead_s"]                # one extra attention kernel per ring step and phase


def p2p_in_domain(s):
    return s / B_RING + A0 + A_NVL


def p2p_across(s):
    return s / B_NET + A0 + A_RAIL


def all_to_all(s, n, m=1):
    k = n / m
    return max((k - 1) / n * s / B_RING, (n - k) / n * s / B_NET) + A0 + (k - 1) * A_NVL + (m - 1) * A_RAIL


def kv_bytes(cp, tp=1, mbs=1):
    """This rank's K and V chunk: 2·b·(s/cp)·a_kv·d·2/tp."""
    return 2 * mbs * S / cp * A_KV * D * BF16 / tp


def qo_bytes(cp, tp=1, mbs=1):
    """One of q/o, what one rank sends in a Ulysses all-to-all: b·(s/cp)·h·2/tp."""
    return mbs * S / cp * H * BF16 / tp


def kv_a2a_bytes(cp, u, tp=1, mbs=1):
    """One of k/v in a Ulysses all-to-all: b·(s/cp)·max(a_kv/tp, u)·d·2 (KV heads replicated to u)."""
    return mbs * S / cp * max(A_KV / tp, u) * D * BF16


def _one(cost: AxisCost, phase: str, purpose: str):
    [c] = [c for c in cost.comms if c.phase == phase and c.purpose == purpose]
    return c


# ---- cp_cost: nothing to do -------------------------------------------------------------------------

def test_no_context_parallelism_or_no_attention_costs_nothing(model):
    assert _cp(model, Plan(dp=2), (1e-3, 2e-3)) == AxisCost()
    assert _cp(model, Plan(cp=2), (1e-3, 2e-3), graph=model.pre) == AxisCost()      # the embedding


# ---- ring ---------------------------------------------------------------------------------------

def test_ring_cp2_in_a_node_exposes_every_hop_when_attention_is_instant(model):
    hop = p2p_in_domain(kv_bytes(2))                       # 2 MiB over NVLink: 12.67 µs
    cost = _cp(model, Plan(cp=2), (0.0, 0.0))
    fwd, bwd = _one(cost, "forward", "ring"), _one(cost, "backward", "ring")
    assert (fwd.kind, fwd.nbytes, fwd.calls, fwd.ranks) == ("p2p", kv_bytes(2), 1, (0, 1))
    assert (bwd.nbytes, bwd.calls) == (kv_bytes(2), 2)                              # K/V and their gradients
    assert fwd.seconds == pytest.approx(hop + LAUNCH, rel=1e-12)
    assert bwd.seconds == pytest.approx(2 * hop + LAUNCH, rel=1e-12)
    assert cost.exposed_fwd_s == pytest.approx(hop + LAUNCH, rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(2 * hop + LAUNCH, rel=1e-12)


def test_ring_hops_hide_behind_one_nth_of_attention_per_step(model):
    n, hop = 4, p2p_in_domain(kv_bytes(4))
    # c/n = hop/2 forward (half of each hop shows), c/n = hop backward (half of 2·hop shows)
    cost = _cp(model, Plan(cp=4), (n * hop / 2, n * hop))
    assert cost.exposed_fwd_s == pytest.approx((n - 1) * (hop - hop / 2 + LAUNCH), rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx((n - 1) * (2 * hop - hop + LAUNCH), rel=1e-12)
    assert _one(cost, "forward", "ring").seconds == pytest.approx((n - 1) * (hop + LAUNCH), rel=1e-12)
    # long attention: only the extra kernels' launches remain
    long = _cp(model, Plan(cp=4), (1.0, 1.0))
    assert (long.exposed_fwd_s, long.exposed_bwd_s) == (pytest.approx(3 * LAUNCH), pytest.approx(3 * LAUNCH))


def _f(length):
    """A sequence dim's efficiency factor: L / (L + gemm_half_dim)."""
    return length / (length + PROFILE["gemm_half_dim"])


def test_ring_steps_add_merge_traffic_and_chunk_kernels_on_the_compute_stream(model):
    """Beside its hops a ring of n adds, per micro-batch on the compute stream, what its n − 1 extra
    steps move through HBM (per element of q: 2.75·e forward, 6·e + 6 backward; of K and V
    together: 0.5·e forward, 2.75·e backward; e = 2 bytes) at the memory roofline plus one
    launch, and its chunk kernels' efficiency: of its n steps one is s/n × s/n, the others
    s/n × s/2n, against the s × s kernel the attention seconds price."""
    n, att = 4, (1e-3, 2e-3)
    e_q = S / n * 16 * D                          # q elements of a rank: s/n tokens of 16 heads of d
    e_kv = 2 * S / n * A_KV * D                   # its k and v
    mem = CLUSTER.gpu.hbm_bw * PROFILE["memory_fraction"]
    fwd_bytes = (n - 1) * (e_q * 2.75 * BF16 + e_kv * 0.5 * BF16)
    bwd_bytes = (n - 1) * (e_q * (6 * BF16 + 6) + e_kv * 2.75 * BF16)
    whole, full = _f(S) ** 2, S / n
    slow = (whole / _f(full) ** 2 - 1 + (n - 1) * (whole / (_f(full) * _f(full / 2)) - 1)) / n
    cost = _cp(model, Plan(cp=n), att)
    assert cost.compute_fwd_s == pytest.approx(fwd_bytes / mem + LAUNCH + slow * att[0], rel=1e-12)
    assert cost.compute_bwd_s == pytest.approx(bwd_bytes / mem + LAUNCH + slow * att[1], rel=1e-12)
    assert 0.28 < slow < 0.3                      # 1024- and 512-token chunks of a 4096-token sequence
    # Ulysses runs one kernel over the whole sequence: nothing on the compute stream
    uly = _cp(model, Plan(cp=n, cp_algo="ulysses"), att)
    assert (uly.compute_fwd_s, uly.compute_bwd_s) == (0.0, 0.0)
    # USP 8 × 2: a rank holds s/2 tokens after the all-to-all, one extra step
    usp = _cp(model, Plan(cp=16, cp_algo="usp"), att)
    e_q, e_kv, full = S / 16 * 16 * D, 2 * S / 16 * 8 * D, S / 2      # a_kv = 8 = u: no replication
    slow = (whole / _f(full) ** 2 - 1 + (whole / (_f(full) * _f(full / 2)) - 1)) / 2
    assert usp.compute_fwd_s == pytest.approx((e_q * 2.75 * BF16 + e_kv * 0.5 * BF16) / mem + LAUNCH
                                              + slow * att[0], rel=1e-12)


def test_cp_overlap_scales_the_attention_the_hops_hide_behind(model):
    n, hop = 4, p2p_in_domain(kv_bytes(4))
    cost = _cp(model, Plan(cp=4), (n * hop, 2 * n * hop), params=Params(cp_overlap=0.25))
    assert cost.exposed_fwd_s == pytest.approx((n - 1) * (hop - 0.25 * hop + LAUNCH), rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx((n - 1) * (2 * hop - 0.25 * 2 * hop + LAUNCH), rel=1e-12)


def test_ring_cp16_waits_for_its_slowest_hop_across_the_network(model):
    # ranks 0..15: hops 7 → 8 and the wrap-around 15 → 0 leave the node (rail leaf, 47 GB/s)
    hop = p2p_across(kv_bytes(16))                         # 256 KiB: 5.58 µs + 11 µs
    cost = _cp(model, Plan(cp=16), (0.0, 0.0))
    assert _one(cost, "forward", "ring").ranks == tuple(range(16))
    assert (_one(cost, "forward", "ring").calls, _one(cost, "backward", "ring").calls) == (15, 30)
    assert cost.exposed_fwd_s == pytest.approx(15 * (hop + LAUNCH), rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(15 * (2 * hop + LAUNCH), rel=1e-12)


def test_ring_outside_tp8_sends_a_tp_shard_across_nodes(model):
    cost = _cp(model, Plan(tp=8, cp=2), (0.0, 0.0))        # cp ranks 0, 8
    hop = p2p_across(kv_bytes(2, tp=8))
    assert _one(cost, "forward", "ring").ranks == (0, 8)
    assert _one(cost, "forward", "ring").nbytes == kv_bytes(2, tp=8) == 262144
    assert cost.exposed_fwd_s == pytest.approx(hop + LAUNCH, rel=1e-12)


def test_ring_and_ulysses_send_the_element_size_the_trace_records(model, traced):
    """An fp32 trace's q, k and v are 4 bytes an element (``ir.TensorInfo.dtype``): every send
    doubles; the bf16 trace above is priced at 2 bytes."""
    fp32 = traced(SPEC, seq=S, dtype="fp32")
    assert attention_bytes(model.blocks[0].graph) == (BF16, BF16)
    assert attention_bytes(fp32.blocks[0].graph) == (4, 4)
    ring = _cp(fp32, Plan(cp=4), (0.0, 0.0))
    assert _one(ring, "forward", "ring").nbytes == 2 * kv_bytes(4)
    uly = _cp(fp32, Plan(cp=4, cp_algo="ulysses"), (0.0, 0.0))
    assert _one(uly, "forward", "ulysses").nbytes == 2 * qo_bytes(4)


# ---- Ulysses -----------------------------------------------------------------------------------------

def test_ulysses_cp4_four_all_to_alls_per_pass_on_the_critical_path(model):
    # q and o at 16 heads (1 MiB each), k and v at the 8 KV heads (512 KiB each)
    assert kv_a2a_bytes(4, 4) == qo_bytes(4) / 2 == 524288
    t_qo, t_kv = 2 * all_to_all(qo_bytes(4), 4), 2 * all_to_all(kv_a2a_bytes(4, 4), 4)
    cost = _cp(model, Plan(cp=4, cp_algo="ulysses"), (1.0, 1.0))
    for phase in ("forward", "backward"):
        c, kv = _one(cost, phase, "ulysses"), _one(cost, phase, "ulysses-kv")
        assert (c.kind, c.nbytes, c.calls, c.ranks) == ("all_to_all", qo_bytes(4), 2, (0, 1, 2, 3))
        assert (kv.kind, kv.nbytes, kv.calls, kv.ranks) == ("all_to_all", kv_a2a_bytes(4, 4), 2, (0, 1, 2, 3))
        assert c.seconds == c.exposed_s == pytest.approx(t_qo, rel=1e-12)
        assert kv.seconds == kv.exposed_s == pytest.approx(t_kv, rel=1e-12)
    assert cost.exposed_fwd_s == cost.exposed_bwd_s == pytest.approx(t_qo + t_kv, rel=1e-12)


def test_ulysses_with_fewer_kv_heads_than_ranks_sends_them_replicated(model):
    # tp 2 leaves 4 KV heads a rank; Ulysses over 8 replicates them to 8: k and v as wide as q, o
    cost = _cp(model, Plan(tp=2, cp=8, cp_algo="ulysses"), (1.0, 1.0))
    kv = _one(cost, "forward", "ulysses-kv")
    assert kv.nbytes == kv_a2a_bytes(8, 8, tp=2) == S / 8 * 8 * D * BF16 == qo_bytes(8, tp=2)
    assert not [c for c in cost.comms if c.purpose == "ring"]


def test_ulysses_cp16_across_two_nodes(model):
    def t(s):   # 16 ranks in 2 domains of 8: NVLink moves 7/16 of S, the NICs 8/16 of it
        return max(7 / 16 * s / B_RING, 8 / 16 * s / B_NET) + A0 + 7 * A_NVL + A_RAIL
    cost = _cp(model, Plan(cp=16, mbs=2, cp_algo="ulysses"), (0.0, 0.0))
    # k and v: 8 KV heads replicated to 16 (as wide as q)
    assert kv_a2a_bytes(16, 16, mbs=2) == qo_bytes(16, mbs=2)
    assert cost.exposed_fwd_s == pytest.approx(4 * t(qo_bytes(16, mbs=2)), rel=1e-12)


# ---- USP ---------------------------------------------------------------------------------------------

def test_usp_ulysses_inside_the_node_ring_across(model):
    cost = _cp(model, Plan(cp=16, cp_algo="usp"), (0.0, 0.0))          # Ulysses 8 × ring 2
    uly, kv = _one(cost, "forward", "ulysses"), _one(cost, "forward", "ulysses-kv")
    assert uly.ranks == tuple(range(8)) and uly.nbytes == qo_bytes(16)
    assert uly.seconds == pytest.approx(2 * all_to_all(qo_bytes(16), 8), rel=1e-12)
    assert kv.seconds == pytest.approx(2 * all_to_all(kv_a2a_bytes(16, 8), 8), rel=1e-12)
    ring_f, ring_b = _one(cost, "forward", "ring"), _one(cost, "backward", "ring")
    assert ring_f.ranks == (0, 8) and (ring_f.calls, ring_b.calls) == (1, 2)
    # the total is the parts' sum
    assert cost.exposed_fwd_s == pytest.approx(uly.exposed_s + kv.exposed_s + ring_f.exposed_s, rel=1e-12)
    assert cost.exposed_bwd_s == pytest.approx(_one(cost, "backward", "ulysses").exposed_s
                                               + _one(cost, "backward", "ulysses-kv").exposed_s + ring_b.exposed_s,
                                               rel=1e-12)


def test_usp_ring_passes_the_kv_block_left_after_the_all_to_all(model):
    # Fang & Zhao 2024: q, k, v are all-to-all'd over the Ulysses group (sequence s/cp → s/r, heads
    # a → a/u), then ring attention runs over r ranks passing K/V of (s/r)·(a_kv/u)·d: with a_kv = 8
    # divisible by u = 8 that is 2·(s/r)·(a_kv/u)·d·2 = 2·(s/cp)·a_kv·d·2 = kv_bytes(16)
    u, r = 8, 2
    chunk = 2 * (S / r) * (A_KV / u) * D * BF16
    assert chunk == kv_bytes(16) == 262144
    cost = _cp(model, Plan(cp=16, cp_algo="usp"), (0.0, 0.0))
    ring_f = _one(cost, "forward", "ring")
    assert ring_f.nbytes == chunk
    assert ring_f.exposed_s == pytest.approx((r - 1) * (p2p_across(chunk) + LAUNCH), rel=1e-12)


# ---- attention_seconds ---------------------------------------------------------------------------------

PEAK = C.gpu.bf16_flops
HBM = C.gpu.hbm_bw * PROFILE["memory_fraction"]
F_FWD = 4 * S * S * H                                      # QKᵀ and PV, 2·s²·d FLOPs per head each, full s²
F_BWD = 2.5 * F_FWD                                        # Dao 2023 §3.1: 5 GEMMs vs 2


def _kernel(flops, frac, eff):
    return flops * frac / (PEAK * PROFILE[eff]) + LAUNCH


def test_traced_attention_flops_count_full_s_squared(model):
    kernels = [n for n in model.blocks[0].graph.ops() if "attention" in n.op]
    assert sorted((n.phase, n.flops) for n in kernels) == [("backward", F_BWD), ("forward", F_FWD)]
    # compute bound at every scale (bytes and FLOPs both scale by mbs/cp/tp, the work fraction is ≥ 1/2):
    # the roofline's max is the FLOP term, so the expected values below need no byte count
    for n in kernels:
        eff = PROFILE["attention_fwd_fraction" if n.phase == "forward" else "attention_bwd_fraction"]
        assert (n.bytes_read + n.bytes_written) / HBM < 0.5 * n.flops / (PEAK * eff)


def test_attention_seconds_one_gpu_computes_the_causal_triangle_and_its_diagonal_tiles(model):
    frac = (1 + TILE / S) / 2                              # 32 tiles a side: 528 of 1024
    fwd, bwd = _attention(model, Plan())
    assert fwd == pytest.approx(_kernel(F_FWD, frac, "attention_fwd_fraction"), rel=1e-12)     # 62.3 µs
    assert bwd == pytest.approx(_kernel(F_BWD, frac, "attention_bwd_fraction"), rel=1e-12)


def test_attention_seconds_scale_with_mbs_over_cp_and_tp_as_the_docstring_says(model):
    # opkinds.attention_work_fraction: (1 + T/s)/2 of the rank's counted FLOPs, whatever cp
    frac = (1 + TILE / S) / 2
    fwd, bwd = _attention(model, Plan(tp=2, cp=2, mbs=2))
    scale = 2 / 2 / 2
    assert fwd == pytest.approx(_kernel(F_FWD * scale, frac, "attention_fwd_fraction"), rel=1e-12)
    assert bwd == pytest.approx(_kernel(F_BWD * scale, frac, "attention_bwd_fraction"), rel=1e-12)


def test_ring_attention_work_fraction_does_not_grow_with_cp(model):
    # Load-balanced (zigzag) ring over cp ranks, M_l = s_l/T tiles a side per rank: step 0 is a causal
    # kernel on the local chunk, M_l(M_l+1)/2 tiles; each of the cp−1 other steps half a block, M_l²/2.
    # A rank counts M_l·(s/T) = cp·M_l² tiles (full s²/cp), so its fraction is
    # (cp·M_l²/2 + M_l/2) / (cp·M_l²) = (1 + T/s)/2, whatever cp.
    cp = 8
    m_l = S / cp / TILE
    frac = (cp * m_l ** 2 / 2 + m_l / 2) / (cp * m_l ** 2)
    assert frac == pytest.approx((1 + TILE / S) / 2)
    fwd, _ = _attention(model, Plan(cp=cp))
    assert fwd == pytest.approx(_kernel(F_FWD / cp, frac, "attention_fwd_fraction"), rel=1e-9)
