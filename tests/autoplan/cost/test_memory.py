"""The memory model, against bytes computed here from the formulas (not from the code under test)."""
import pytest

from autoplan.cost import memory
from autoplan.plan import Plan
from costmodels.memory import GIB, model_state_bytes
from costmodels.pipeline.live import peak_live

LLAMA = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=768,vocab=1024"
H, HEADS, KV, FFN, V, SEQ = 256, 4, 2, 768, 1024, 512
HD = H // HEADS


@pytest.mark.parametrize("zero,pp,expected", [
    (0, 1, (2, 4, 12)),                    # Megatron DDP: bf16 weight, fp32 grad, fp32 master + m + v
    (1, 1, (2, 4, 12 / 8)),                # distributed optimizer: 6 + 12/d
    (2, 1, (2 + 4 / 8, 4 / 8, 8 / 8)),     # FSDP2 kept after forward: 2 + 16/d
    (3, 1, (4 / 8, 4 / 8, 8 / 8)),         # FSDP2 resharded: 16/d
    (3, 2, (2 + 4 / 8, 4 / 8, 8 / 8)),     # torchtitan turns resharding off under pp
])
def test_state_bytes_per_parameter(zero, pp, expected):
    s = model_state_bytes(1e9, zero=zero, dp=8, reshard=pp == 1)   # torchtitan: reshard_after_forward = not pp
    assert (s.params, s.grads, s.optimizer) == pytest.approx(tuple(x * 1e9 for x in expected))


def megatron_alive(p: int, m: int, v: int) -> dict[int, int]:
    """Rank 0 of Megatron's interleaved table: forwards run (mb, chunk) in groups of p micro-batches
    per chunk; the peak is after the 2(p−1) + (v−1)p warm-up forwards and one more."""
    table = [(g + i, c) for g in range(0, m, p) for c in range(v) for i in range(p)]
    alive: dict[int, int] = {}
    for _, c in table[:2 * (p - 1) + (v - 1) * p + 1]:
        alive[c * p] = alive.get(c * p, 0) + 1       # chunk c of rank 0 is virtual stage c·p
    return alive


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 3), (8, 16, 2)])
def test_interleaved_rank0_holds_megatrons_warmup_per_chunk(p, m, v):
    peak = peak_live("interleaved", p, m, v, [1.0] * (p * v))[0]
    assert peak.alive == megatron_alive(p, m, v)
    assert peak.bytes == 2 * (p - 1) + (v - 1) * p + 1


def test_uneven_chunks_are_weighed_by_their_own_bytes_not_a_mean():
    p, m, v = 4, 8, 2
    weights = [1.0 if s < p else 3.0 for s in range(p * v)]      # second chunk of every rank 3× heavier
    peak = peak_live("interleaved", p, m, v, weights)[0]
    assert peak.bytes >= sum(weights[s] * n for s, n in megatron_alive(p, m, v).items())
    mean = (1.0 + 3.0) / 2
    assert peak.bytes != pytest.approx(mean * (2 * (p - 1) + (v - 1) * p + 1))


@pytest.mark.parametrize("schedule,p,m,v,expected", [
    ("1f1b", 4, 8, 1, [4, 3, 2, 1]),          # p − r
    ("gpipe", 4, 6, 1, [6, 6, 6, 6]),         # all m
    ("zbv", 4, 8, 2, [8, 8, 8, 8]),           # 2p chunks = 1F1B's p stages
])
def test_peak_counts_match_the_papers(schedule, p, m, v, expected):
    assert [x.bytes for x in peak_live(schedule, p, m, v, [1.0] * (p * v))] == expected


def per_token_saved(policy: str) -> float:
    """Bytes per token one Llama block keeps for backward (bf16 activations, fp32 statistics)."""
    if policy == "full":
        return 2 * H                            # the block input only
    inputs = 2 * H + 2 * 2 * HD                 # block input + the rope cos/sin the block reads
    attention = 2 * H + 4 * HEADS               # flash output + fp32 logsumexp
    if policy == "op":                          # matmuls 1, 3, 5, 7 kept: wq, wv, w1, w2
        return inputs + attention + 2 * H + 2 * KV * HD + 2 * FFN + 2 * H
    raise ValueError(policy)


@pytest.mark.parametrize("policy", ["op", "full"])
def test_block_saved_bytes_by_policy(setup, policy):
    graph, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    plan = Plan.parse("dp=8,zero=3")
    from autoplan.mesh import Mesh
    part = est.part(graph.blocks[0].kind, plan, policy, Mesh.of(plan))
    assert part.saved_bytes == pytest.approx(per_token_saved(policy) * SEQ, rel=0.01)
    none = est.part(graph.blocks[0].kind, plan, "none", Mesh.of(plan))
    assert part.recompute_transient_bytes == pytest.approx(none.saved_bytes - part.saved_bytes)


@pytest.mark.parametrize("batch,grads", [(16, True), (8, False)])   # 2 micro-batches, or 1
def test_fsdp_states_and_staging_on_one_rank(setup, batch, grads):
    graph, cluster, est = setup(LLAMA, "h100x8", seq=SEQ)
    e = est.estimate(Plan.parse("dp=8,zero=3,recompute=op"), batch)
    n = graph.param_count
    block = graph.blocks[0].graph.param_count
    root = graph.pre.param_count + graph.post.param_count
    b = {k: v * GIB for k, v in e.memory_breakdown_gib.items()}
    # fp32 shard, fp32 gradient shard (none yet at the peak of a one-micro-batch step: zero_grad
    # set them to None), Adam m and v
    assert (b["params"], b["grads"], b["optimizer"]) == pytest.approx(
        (4 * n / 8, 4 * n / 8 if grads else 0.0, 8 * n / 8), rel=1e-6)
    # FSDP staging, the larger of two moments of a block's backward: during it two blocks' and the
    # root's gathered bf16 parameters; after it (its saved activations freed, the block resharded)
    # its gradient staging (bf16 + the fp32 copy) beside one block's and the root's gathered
    # parameters; plus one layer's recompute transient, beyond the loss buffers (another moment)
    none = est.estimate(Plan.parse("dp=8,zero=3"), batch)
    assert none.memory_gib > e.memory_gib
    saved = per_token_saved("op") * SEQ
    transient = none_layer(est, graph) - saved
    staging = max(2 * (2 * block + root), 6 * block + 2 * (block + root) - saved)
    assert b["other"] == pytest.approx(max(0.0, staging + transient - SEQ * V * 8), rel=0.02)


def none_layer(est, graph) -> float:
    from autoplan.mesh import Mesh
    plan = Plan.parse("dp=8,zero=3")
    return est.part(graph.blocks[0].kind, plan, "none", Mesh.of(plan)).saved_bytes


def test_full_n_recomputes_the_first_n_layers_of_each_stage(setup):
    graph, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    act = {rc: est.estimate(Plan.parse(f"dp=8,zero=1,recompute={rc}"), 8).memory_breakdown_gib["activations"]
           for rc in ("none", "full:1", "full:3", "full")}
    per_layer = (per_token_saved("full") * SEQ) / GIB
    step = (act["none"] - act["full"]) / 4                     # one layer's saving, 4 layers
    assert act["full:1"] == pytest.approx(act["none"] - step, rel=1e-6)
    assert act["full:3"] == pytest.approx(act["none"] - 3 * step, rel=1e-6)
    assert step > per_layer


def test_op_recomputes_between_selective_and_full(setup):
    _, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    e = {rc: est.estimate(Plan.parse(f"dp=8,zero=3,recompute={rc}"), 8) for rc in ("none", "op", "full")}
    assert e["none"].hfu == pytest.approx(e["none"].mfu)
    extra = {rc: x.hfu / x.mfu - 1 for rc, x in e.items()}        # recompute FLOPs / model FLOPs
    assert pytest.approx(extra["none"]) == 0 and 0 < extra["op"] < extra["full"] < 1 / 3 + 1e-9
    assert e["none"].step_time_s < e["op"].step_time_s < e["full"].step_time_s
    assert e["full"].memory_gib < e["op"].memory_gib < e["none"].memory_gib


def test_loss_buffers_on_the_last_stage_only(setup):
    _, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    plan = Plan.parse("pp=2,dp=4,mbs=1,zero=1")
    assert memory.loss_bytes(plan, SEQ, V) == SEQ * V * 8
    # vocabulary-parallel (DTensor loss_parallel): one fp32 buffer more per local logit
    assert memory.loss_bytes(Plan.parse("tp=2,pp=2,dp=2,mbs=1,zero=1"), SEQ, V) == SEQ * V / 2 * 12
    e = est.estimate(plan, 8)
    assert len(e.memory_per_stage_gib) == 2


def test_megatron_cores_loss_keeps_its_softmax_in_place(setup):
    """Megatron-Core's vocab_parallel_cross_entropy(logits.float()): beyond the saved fp32 softmax,
    the forward holds the bf16 logits and their fp32 copy (2 + 4 bytes per local logit), the
    backward only the bf16 gradient (2): 6 bytes per local logit at any tp, against torch's 8."""
    for plan in (Plan.parse("pp=2,dp=4,mbs=1,zero=1"), Plan.parse("tp=2,pp=2,dp=2,mbs=2,zero=1")):
        assert memory.loss_bytes(plan, SEQ, V, "megatron-core") == plan.mbs * SEQ * V / plan.tp * 6
    from autoplan.cost import EstimateOptions, Estimator
    from autoplan.mesh import Mesh
    _, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    plan = Plan.parse("pp=2,dp=4,mbs=1,zero=1")
    core = Estimator(est.model, est.cluster, EstimateOptions(kernels="megatron-core"))
    assert core.memory_inputs(plan, Mesh.of(plan), 4)["loss"] == SEQ * V * 6       # the estimate reads it
    assert est.memory_inputs(plan, Mesh.of(plan), 4)["loss"] == SEQ * V * 8


def test_a_weight_gradient_store_frees_all_but_the_linears_inputs_at_b(setup):
    """Under Megatron's WeightGradStore (EstimateOptions.wgrad_store) a split backward's B frees every
    saved byte of a block but its linears' inputs — a llama block's: the two RMSNorm outputs (q/k/v
    and gate/up), the attention output (o) and the SwiGLU product (down), s·(3h + ffn) elements;
    under torch's pipelining it frees none of a block's."""
    from autoplan.cost import EstimateOptions, Estimator
    from autoplan.mesh import Mesh
    graph, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    plan = Plan.parse("pp=2,dp=4,mbs=1,schedule=zb-h1,zero=1")
    kind = graph.blocks[0].kind
    torch_part = est.part(kind, plan, "none", Mesh.of(plan))
    store = Estimator(est.model, est.cluster, EstimateOptions(wgrad_store=True))
    part = store.part(kind, plan, "none", Mesh.of(plan))
    assert torch_part.b_freed_bytes == 0.0
    # node by node: the kept ops' small fp32 outputs (RMSNorm rstd, the attention's log-sum-exp) ride along
    assert part.saved_bytes - part.b_freed_bytes == pytest.approx(SEQ * (3 * H + FFN) * 2, rel=0.01)
    # the W-held peak drops accordingly: zb-h1 under the store holds less than under torch
    torch_peak = max(r.activations for r in est.memory_by_rank(plan, 8))
    store_peak = max(r.activations for r in store.memory_by_rank(plan, 8))
    assert store_peak < torch_peak


def test_fits_means_fits_with_the_margin(setup):
    from autoplan.cost import EstimateOptions
    from autoplan.workload import Workload

    graph, cluster, est = setup(LLAMA, "h100x8", seq=SEQ)
    peak = est.estimate(Plan.parse("dp=8,zero=3"), 8).memory_gib
    hbm = cluster.gpu.hbm_bytes / GIB
    for margin, fits in ((hbm - peak - 0.5, True), (hbm - peak + 0.5, False)):
        w = Workload(graph, cluster, SEQ, 8)
        e = w.estimator(EstimateOptions(memory_margin_gib=margin)).estimate(Plan.parse("dp=8,zero=3"), 8)
        assert e.fits is fits and e.memory_limit_gib == pytest.approx(hbm - margin)
        assert (not fits) == any(v.rule == "memory" for v in e.violations)


def test_state_precision_apex_dfa_bf16_is_4_plus_6_over_d():
    from costmodels.memory import STATE_PRECISIONS
    s = model_state_bytes(1e9, zero=1, dp=2, precision=STATE_PRECISIONS["apex-dfa-bf16"])
    # bf16 weight, bf16 contiguous gradient bucket, bf16 parameter shard + bf16 Adam m, v over d = 2
    assert (s.params, s.grads, s.optimizer) == pytest.approx((2e9, 2e9, 6e9 / 2))
    assert model_state_bytes(1e9, zero=1, dp=2).total == pytest.approx((6 + 12 / 2) * 1e9)


def test_state_precision_reaches_the_estimate_and_unknown_names_are_refused(setup):
    from autoplan.cost import EstimateOptions
    from autoplan.errors import UserError
    from autoplan.workload import Workload

    graph, cluster, _ = setup(LLAMA, "h100x8", seq=SEQ)
    w = Workload(graph, cluster, SEQ, 8)
    plan = Plan.parse("dp=8,zero=1")
    b = {name: w.estimator(EstimateOptions(state_precision=name)).estimate(plan, 8).memory_breakdown_gib
         for name in ("megatron", "apex-dfa-bf16")}
    n = graph.param_count
    assert b["megatron"]["grads"] * GIB == pytest.approx(4 * n)
    assert b["apex-dfa-bf16"]["grads"] * GIB == pytest.approx(2 * n)
    assert b["apex-dfa-bf16"]["optimizer"] * GIB == pytest.approx(6 * n / 8)
    with pytest.raises(UserError, match="state precision"):
        w.estimator(EstimateOptions(state_precision="fp64")).estimate(plan, 8)


def test_fsdp_under_pp_accumulates_fp32_unsharded_grads(setup):
    """No-sync under pp: FSDP2 upcasts each bf16 gradient to reduce_dtype fp32 and accumulates
    unsharded (``to_accumulated_grad_if_needed``): 4 B per parameter beside the 4/d shard."""
    graph, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    e = est.estimate(Plan.parse("pp=2,dp=4,mbs=1,zero=3"), 16)
    mems = e.memory_per_stage_gib
    assert len(mems) == 2
    b = {k: v * GIB for k, v in e.memory_breakdown_gib.items()}
    numel = b["optimizer"] / (8 / 4)                  # Adam m, v: 8/d bytes per parameter of the rank
    assert b["grads"] == pytest.approx(numel * (4 + 4 / 4), rel=1e-6)
    assert b["params"] == pytest.approx(numel * (2 + 4 / 4), rel=1e-6)   # kept gathered under pp



@pytest.mark.parametrize("sync", ["step", "microbatch"])
def test_fsdp_grad_sync_under_pp_sets_where_gradients_accumulate(setup, sync):
    """pp = 2, zero = 2 over d = 4, 4 micro-batches: FSDP2's no-sync (``step``, the default under
    PP) accumulates the rank's unsharded gradients in fp32 (4 B per parameter, beside the 4/d
    shard); reduce-scattering every micro-batch (``microbatch``) keeps only the fp32 shard (4/d)."""
    from autoplan.cost import EstimateOptions, Estimator
    graph, cluster, _ = setup(LLAMA, "h100x8", seq=SEQ)
    options = EstimateOptions() if sync == "step" else EstimateOptions(fsdp_grad_sync=sync)
    e = Estimator(graph, cluster, options).estimate(Plan.parse("pp=2,dp=4,zero=2,mbs=1"), 16)
    b = {k: v * GIB for k, v in e.memory_breakdown_gib.items()}
    numel = b["optimizer"] * 4 / 8                   # Adam m + v: 8 B per parameter over d = 4
    assert b["grads"] == pytest.approx(numel * (4 / 4 + (4 if sync == "step" else 0)), rel=1e-6)


def test_unknown_fsdp_grad_sync_is_a_user_error(setup):
    from autoplan.cost import EstimateOptions, Estimator
    from autoplan.errors import UserError
    graph, cluster, _ = setup(LLAMA, "h100x8", seq=SEQ)
    with pytest.raises(UserError, match="gradient sync 'often'"):
        Estimator(graph, cluster, EstimateOptions(fsdp_grad_sync="often")).estimate(
            Plan.parse("pp=2,dp=4,zero=2,mbs=1"), 16)


def test_split_backward_prices_the_loss_at_b_and_one_bf16_weight_gradient_at_w(setup):
    """zbv's rank 0 holds the embedding and the head (V×H each, the largest parameters): W holds
    one bf16 gradient of V·H elements before its fold into main_grad (zero 1), FSDP (zero 2)
    stages its own instead; a full backward has no such moment.  The loss buffers are a moment
    of the last stage's B: at least them, at most the walk's peak plus them."""
    graph, _, est = setup(LLAMA, "h100x8", seq=SEQ)
    split = est.estimate(Plan.parse("pp=2,dp=4,vpp=2,mbs=1,schedule=zbv,zero=1"), 8)
    assert split.memory_breakdown_gib["other"] * GIB == pytest.approx(2 * V * H)
    fsdp = est.estimate(Plan.parse("pp=2,dp=4,vpp=2,mbs=1,schedule=zbv,zero=2"), 8)
    block = graph.blocks[0].graph.param_count
    assert fsdp.memory_breakdown_gib["other"] * GIB == pytest.approx(2 * block)   # one block's fresh bf16 gradients
    full = est.estimate(Plan.parse("pp=2,dp=4,mbs=1,schedule=1f1b,zero=1"), 8)
    assert full.memory_breakdown_gib["other"] == 0.0
    act = split.memory_breakdown_gib["activations"] * GIB
    assert act >= SEQ * V * 8
