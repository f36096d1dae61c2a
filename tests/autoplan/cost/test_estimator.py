"""Estimator: the step-time breakdown is taken on the busiest pipeline rank and adds up."""
import pytest

from autoplan.plan import Plan

MODEL = "gpt:layers=8,hidden=1024,heads=16,vocab=51200"


@pytest.mark.parametrize("layers", ["2-2-2-2", "1-1-1-5", "5-1-1-1"])
def test_breakdown_adds_up_to_the_step_on_uneven_stages(setup, layers):
    _, _, estimator = setup(MODEL, "h100x16")
    est = estimator.estimate(Plan.parse(f"tp=1,pp=4,dp=4,layers={layers},schedule=1f1b"), 64)
    parts = est.time_breakdown_s
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(est.step_time_s, rel=0.01)


@pytest.mark.parametrize("layers", ["2-2-2-2", "3-2-2-1"])
def test_bubble_is_at_most_the_1f1b_closed_form_on_the_busiest_rank(setup, layers):
    """The head (2·h·V FLOPs per token ≈ 4 layers here) makes the last rank the busiest even
    with fewer layers; its extra compute is imbalance, not bubble: bubble ≤ (p−1)/m · compute."""
    _, _, estimator = setup(MODEL, "h100x16")
    est = estimator.estimate(Plan.parse(f"tp=1,pp=4,dp=4,layers={layers},schedule=1f1b"), 64)
    m = 64 // 4
    parts = est.time_breakdown_s
    assert 0 < parts["pp_bubble"] <= (4 - 1) / m * parts["compute"]


LONG = "llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256"


def test_block_layout_is_solved_at_the_plans_own_cp_whatever_was_priced_before(setup):
    """131K tokens: on one cp rank (cp=1) the block ILP keeps the tokens sharded and moves the
    weights instead (131K tokens of activations cost more to reduce than the weights to gather:
    its forward gathers weights and moves activations by all-to-all, never a row-parallel
    reduce-scatter; which dim a gathered weight is stored on is a tie the solver breaks); at
    cp=16 a rank holds 8K tokens and Megatron's row-parallel layout (S(1), activations
    reduce-scattered) wins.  A plan is priced with the layout of its own local shape, and its
    price does not depend on which plans the estimator priced first."""
    from autoplan.cost import Estimator
    from autoplan.cost.prices import AxisPricer
    from autoplan.mesh import Mesh
    from autoplan.sharding import ShardingContext, price_assignment, solve_assignment

    model, cluster, est = setup(LONG, "h100x128", seq=131072)
    short = Plan.parse("tp=8,cp=1,dp=16,mbs=1,sp=on", num_gpus=128)
    long = Plan.parse("tp=8,cp=16,dp=1,mbs=1,sp=on", num_gpus=128)
    placements = {p: dict(est.layout(p).blocks[0].params) for p in (short, long)}
    assert placements[short] != placements[long]
    assert placements[long]["attention.o_proj.weight"] == "S(1)"
    assert placements[long]["feed_forward.down_proj.weight"] == "S(1)"
    after_short = est.estimate(long, 4).to_dict()
    assert Estimator(model, cluster).estimate(long, 4).to_dict() == after_short
    # the cp=1 layout re-priced at cp=16 (the old reference-point shortcut) exposes 2x more tp time
    graph, mesh = model.blocks[0].graph, Mesh.of(long)

    def ctx(plan):
        return ShardingContext(tp=8, sp=True, pricer=AxisPricer(est.prices, mesh), cp=plan.cp)
    stale = price_assignment(graph, solve_assignment(graph, ctx(short)), ctx(long))
    fresh = price_assignment(graph, solve_assignment(graph, ctx(long)), ctx(long))
    assert fresh.comm_seconds() < stale.comm_seconds() / 2
    forward = {p: {c.kind for c in price_assignment(graph, solve_assignment(graph, ctx(p)), ctx(p)).collectives
                   if c.phase == "forward"} for p in (short, long)}
    assert "reduce_scatter" not in forward[short] and "reduce_scatter" in forward[long]


def _per_call(est, traffic, kind="p2p"):
    (p,) = [p for p in est.primitives if p.traffic == traffic and p.kind == kind]
    return p, p.time_s / p.calls_per_step


def test_ring_cp_and_pipeline_sends_are_priced_on_their_slowest_hop(setup):
    """tp=2, cp=8 on two 8-GPU nodes: the cp ring is ranks 0, 2, …, 14; its first hop (0→2) is
    NVLink but 6→8 and the wrap-around 14→0 cross the network, and every ring step waits for
    them.  pp=8 outermost (ranks 0, 2, …, 14): stage 3 → 4 (rank 6 → 8) crosses nodes, and every
send is priced there."""
    _, _, estimator = setup(MODEL, "h100x16")
    prices = estimator.prices
    ring = estimator.estimate(Plan.parse("tp=2,cp=8,dp=1,cp_algo=ring,sp=on", num_gpus=16), 8)
    prim, per_call = _per_call(ring, "cp")
    assert prim.level != "nvlink"
    crossing = prices.collective("p2p", prim.bytes_per_call, (6, 8))
    # each ring step also launches one more attention kernel per pass: + 2/3 launch per hop
    assert per_call == pytest.approx(crossing + 2 / 3 * prices.profile.overhead_s, rel=1e-9)
    assert per_call > 2 * prices.collective("p2p", prim.bytes_per_call, (0, 2))
    pipe = estimator.estimate(Plan.parse("tp=1,pp=8,dp=2,order=tp-cp-ep-dp-pp", num_gpus=16), 16)
    prim, per_call = _per_call(pipe, "pp")
    assert prim.level != "nvlink"
    assert per_call == pytest.approx(prices.collective("p2p", prim.bytes_per_call, (6, 8)), rel=1e-9)


@pytest.mark.parametrize("sp", ["on", "off"])
def test_pipeline_sends_split_the_activation_over_tp(setup, sp):
    """Each tp rank sends 1/tp of the boundary activation (b·s·h·2 bytes): sequence-sharded under
    SP; without SP split over tp and all-gathered on the receiving stage over NVLink (Megatron's
    scatter/gather), an all-gather per send that SP does not pay."""
    _, _, estimator = setup(MODEL, "h100x16")
    est = estimator.estimate(Plan.parse(f"tp=4,pp=4,dp=1,sp={sp}", num_gpus=16), 16)
    full = 1 * 2048 * 1024 * 2
    send, per_send = _per_call(est, "pp")
    assert send.bytes_per_call == full / 4
    gathers = [p for p in est.primitives if p.traffic == "pp" and p.kind == "all_gather"]
    if sp == "on":
        assert not gathers
        assert per_send == pytest.approx(estimator.prices.collective("p2p", full / 4, (4, 8)))  # 4 -> 8 leaves the node
    else:
        (gather,) = gathers
        assert gather.level == "nvlink" and gather.calls_per_step == send.calls_per_step
        assert gather.bytes_per_call == full
        assert gather.time_s / gather.calls_per_step == pytest.approx(
            estimator.prices.collective("all_gather", full, (0, 1, 2, 3)))


def test_pipeline_sends_the_element_size_the_trace_records(setup, traced):
    """The boundary activation is the residual stream at its traced element size
    (``PlanContext.activation_bytes``): 2 bytes in bf16, 4 in an fp32 trace."""
    from autoplan.cost import Estimator
    from autoplan.cost.pp import boundary
    from autoplan.mesh import Mesh

    _, cluster, bf16 = setup(MODEL, "h100x16")
    fp32 = Estimator(traced(MODEL, seq=2048, dtype="fp32"), cluster)
    plan = Plan.parse("tp=4,pp=4,dp=1", num_gpus=16)
    assert (bf16.activation_bytes, fp32.activation_bytes) == (2, 4)
    sends = [boundary(est.context(plan, Mesh.of(plan))).bytes_per_rank for est in (bf16, fp32)]
    assert sends == [2048 * 1024 * 2 / 4, 2048 * 1024 * 4 / 4]


CAUSAL = "llama:layers=2,hidden=2048,heads=16,kv_heads=4,ffn=5632,vocab=32000"


def test_causal_flash_attention_is_priced_at_the_tiles_it_computes_and_counted_at_full_s2(setup):
    """A causal flash kernel computes the lower triangle's 128×128 tiles and the diagonal ones,
    (1 + 128/s)/2 of full s² whatever cp (a load-balanced ring); its FLOPs (and so MFU) stay at full
    s² (Megatron's convention).  Backward over forward is the kernels' own ratio: 2.5× the FLOPs
    at the backward's efficiency (was a fixed 2×)."""
    from autoplan.cost.cp import attention_seconds
    from autoplan.mesh import Mesh
    from autoplan.opkinds import attention_work_fraction, is_attention_kernel

    model, _, est = setup(CAUSAL, "h100x16", seq=8192)
    graph = model.blocks[0].graph
    fwd, bwd = (n for n in graph.ops() if is_attention_kernel(n))
    assert fwd.attention_causal and bwd.attention_causal
    assert bwd.flops == pytest.approx(2.5 * fwd.flops)
    assert attention_work_fraction(fwd) == pytest.approx(0.5 + 64 / 8192)
    assert attention_work_fraction(bwd) == pytest.approx(0.5 + 64 / 8192)       # whatever cp
    plan = Plan.parse("tp=1,dp=16", num_gpus=16)
    f, b = attention_seconds(est.context(plan, Mesh.of(plan)), graph)
    prof = est.prices.profile
    assert b / f == pytest.approx(2.5 * prof.attention_fwd_fraction / prof.attention_bwd_fraction, rel=0.01)
    full = est.prices.op_seconds("attention_fwd", fwd.flops, fwd.bytes_read + fwd.bytes_written, None)
    assert f == pytest.approx(full * attention_work_fraction(fwd), rel=0.01)
    e = est.estimate(plan, 16)
    per_sample = sum(n.flops for n in graph.ops() if n.gemm or is_attention_kernel(n)) * model.blocks[0].count
    assert e.model_flops_per_step >= 16 * per_sample      # full s² attention FLOPs, plus embedding/head


def test_ring_attention_exposes_each_steps_hop_beyond_its_compute(setup):
    """Ring CP runs n steps of 1/n of the attention work each, overlapping the next hop: exposed
    forward = (n−1)·(max(0, hop − c/n) + launch), the local step never hiding a send."""
    from autoplan.cost.cp import attention_seconds
    from autoplan.mesh import Mesh

    model, _, est = setup(CAUSAL, "h100x16", seq=8192)
    plan = Plan.parse("tp=1,cp=16,dp=1,cp_algo=ring", num_gpus=16)
    kind, graph = model.blocks[0].kind, model.blocks[0].graph
    part = est.part(kind, plan, "none", Mesh.of(plan))
    (ring_f,) = [c for c in part.comms if c.purpose == "ring" and c.phase == "forward"]
    hop, _ = est.prices.slowest_hop(ring_f.nbytes, Mesh.of(plan).group("cp"), closed=True)
    att_f, _ = attention_seconds(est.context(plan, Mesh.of(plan)), graph)
    launch = est.prices.profile.overhead_s
    assert hop > att_f / 16                                # across nodes the hop outlasts a step
    assert ring_f.exposed_s == pytest.approx(15 * (hop - att_f / 16 + launch))
    assert ring_f.seconds == pytest.approx(15 * (hop + launch))


def test_1f1b_with_fewer_microbatches_than_stages_prices_as_gpipe(setup):
    """m < pp: 1F1B's warm-up covers every micro-batch, so its order is GPipe's (Megatron, DeepSpeed)."""
    _, _, estimator = setup(MODEL, "h100x16")
    one_f = estimator.estimate(Plan.parse("tp=1,pp=4,dp=4,mbs=1,schedule=1f1b"), 8)
    gpipe = estimator.estimate(Plan.parse("tp=1,pp=4,dp=4,mbs=1,schedule=gpipe"), 8)
    assert one_f.microbatches == 2
    assert one_f.step_time_s == pytest.approx(gpipe.step_time_s, rel=1e-9)
    assert one_f.bubble_fraction > 0.5


MOE = "moe:layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2048,vocab=32000,experts=8,topk=2,moe_ffn=1024"


@pytest.mark.parametrize("model,plan", [
    (MODEL, "tp=2,pp=4,dp=2,vpp=2,schedule=interleaved,zero=1"),
    (MODEL, "tp=1,pp=2,dp=8,vpp=2,schedule=zbv,zero=2"),
    (MODEL, "tp=2,pp=2,dp=4,schedule=1f1b,zero=3,recompute=full"),
    (MODEL, "tp=1,pp=1,dp=16,zero=3"),
    (MOE, "tp=2,pp=2,dp=4,ep=2,schedule=1f1b,zero=2"),
])
def test_step_only_pricing_equals_the_estimates_step_to_the_bit_on_every_sample(setup, model, plan):
    """A band prices each sample with ``step_time_s``, which skips the activation peaks and the
    report; it must give the very float ``estimate`` gives, at the point and on every sample
    (each sample moves the overlap, efficiency and network parameters the step reads)."""
    from autoplan.cost.uncertainty import Sampler

    _, _, estimator = setup(model, "h100x16")
    p = Plan.parse(plan)
    for e in [estimator] + Sampler(estimator, 6, seed=1).estimators():
        assert e.step_time_s(p, 64) == e.estimate(p, 64, detail=False).step_time_s
    assert estimator.step_time_s(p, 64) == estimator.estimate(p, 64).step_time_s


def test_post_validation_prices_the_steady_step_where_it_differs(setup):
    """Optimizer post-validation (EstimateOptions.post_validation) replaces the pipeline's makespan
    by its steady step: ZB-H2 gets faster than ZB-H1, 1F1B (rank 0 first and last) does not move."""
    import dataclasses

    graph, cluster, sync = setup(MODEL, "h100x16")
    post = type(sync)(graph, cluster, dataclasses.replace(sync.options, post_validation=True))
    steps = {}
    for schedule in ("1f1b", "zb-h1", "zb-h2"):
        plan = Plan.parse(f"tp=1,pp=4,dp=4,schedule={schedule}")
        steps[schedule] = (sync.estimate(plan, 64).step_time_s, post.estimate(plan, 64))
    assert steps["1f1b"][1].step_time_s == steps["1f1b"][0]
    zb2 = steps["zb-h2"][1]
    parts = zb2.time_breakdown_s
    assert sum(parts.values()) == pytest.approx(zb2.step_time_s, rel=0.01)
    assert zb2.step_time_s < steps["zb-h2"][0]
    assert zb2.step_time_s < steps["zb-h1"][1].step_time_s < steps["1f1b"][0]


def test_ilp_gap_is_the_plans_own_not_the_worst_the_estimator_has_seen(traced):
    """A block layout solved with a 5 % gap (its ILP stopped at the time limit) is reported on the
    plans that use it, and not on a plan priced after it with layouts solved to optimality."""
    import dataclasses

    import topologies
    from autoplan.cost import Estimator
    from autoplan.mesh import Mesh

    model = traced("llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128", seq=64)
    est = Estimator(model, topologies.load("h100x8"))
    gapped, exact = Plan.parse("tp=2,dp=4", num_gpus=8), Plan.parse("tp=4,dp=2", num_gpus=8)
    kind, mesh = model.blocks[0].kind, Mesh.of(gapped)
    solved = est.layouts.solve(kind, est.graph(kind), gapped, mesh)
    est.layouts.store([(est.layouts.assignment_key(kind, gapped, mesh), dataclasses.replace(solved, gap=0.05))])
    assert est.estimate(gapped, 8).ilp_gap == 0.05
    assert est.estimate(exact, 8).ilp_gap == 0.0
    assert est.estimate(gapped, 8).ilp_gap == 0.05
