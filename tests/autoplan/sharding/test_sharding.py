"""The block ILP rediscovers Megatron's tensor and sequence parallelism from the traced graph.

Nothing here is a template: the tests read the collectives and layouts the ILP chose and
check them against what Megatron-LM does by hand (Shoeybi et al. 2019; Korthikanti 2022).
"""
import pytest

from autoplan.sharding import price_assignment, solve_assignment
from costmodels.memory import korthikanti_layer_bytes


def solve_block(graph, ctx):
    """Solve the block ILP at ``ctx`` and price the layout there."""
    return price_assignment(graph, solve_assignment(graph, ctx), ctx)


def big(bs, kind, phase=None, min_bytes=1e6):
    """Collectives of ``kind`` moving activation-sized tensors (not the tiny norm-weight grads)."""
    return [c for c in bs.collectives if c.kind == kind and c.nbytes >= min_bytes
            and (phase is None or (c.phase == phase if phase != "backward" else c.phase in ("backward", "wgrad")))]


@pytest.mark.parametrize("block", ["gpt_block", "llama_block"])
@pytest.mark.parametrize("backend", ["cpsat", "cbc"])
def test_tp8_without_sp_is_megatron_column_then_row(block, backend, request, h100):
    graph = request.getfixturevalue(block)
    bs = solve_block(graph, h100(8, sp=False, backend=backend))
    # exactly two all-reduces forward (after attention and MLP) and two backward
    assert len(big(bs, "all_reduce", "forward")) == 2
    assert len(big(bs, "all_reduce", "backward")) == 2
    assert not [c for c in bs.collectives if c.kind in ("all_gather", "reduce_scatter", "all_to_all")
                and c.nbytes >= 1e6]
    # column-parallel projections (weight [out, in] sharded on out), row-parallel output ones
    pl = bs.param_placements
    column = [n for n in pl if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))]
    column += [n for n in pl if n.endswith(("up_proj.weight", "gate_proj.weight"))]
    row = [n for n in pl if n.endswith(("o_proj.weight", "down_proj.weight"))]
    assert len(column) >= 4 and len(row) == 2
    assert all(pl[n] == "S(0)" for n in column), {n: pl[n] for n in column}
    assert all(pl[n] == "S(1)" for n in row), {n: pl[n] for n in row}
    assert all(pl[n] == "R" for n in pl if "norm" in n or n.startswith("ln"))


def test_tp8_with_sp_is_reduce_scatter_all_gather_pairs(gpt_block, a100):
    bs = solve_block(gpt_block, a100(8, sp=True))
    # forward: all-gather before each column-parallel group, reduce-scatter after each row-parallel one
    assert len(big(bs, "all_gather", "forward")) == 2
    assert len(big(bs, "reduce_scatter", "forward")) == 2
    assert not big(bs, "all_reduce")
    # backward mirrors them (and re-gathers the inputs of the weight gradients, as Megatron does)
    assert len(big(bs, "reduce_scatter", "backward")) == 2
    assert len(big(bs, "all_gather", "backward")) == 4
    _norms_sequence_sharded(gpt_block, bs)


def test_llama_with_sp_shards_the_sequence_outside_the_gemms(llama_block, a100):
    """GQA Llama at tp=8, SP on: the activation collectives of the forward are Megatron's two
    all-gather/reduce-scatter pairs and the norms run sequence-sharded.  (The ILP also finds it
    cheaper to keep q/k/v weights input-sharded and re-lay them out with small all-to-alls than
    to re-gather the 8192-wide activations for the weight gradients: a legal layout DTensor runs.)"""
    bs = solve_block(llama_block, a100(8, sp=True))
    forward = [c for c in bs.collectives if c.phase == "forward" and c.nbytes >= 20e6]
    assert sorted(c.kind for c in forward) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert not big(bs, "all_reduce")
    _norms_sequence_sharded(llama_block, bs)


def test_bias_free_layernorm_block_with_sp_is_megatron_too(a100):
    """A Llama block with LayerNorm (no bias) instead of RMSNorm: the same two pairs forward,
    no activation all-reduce anywhere, norms sequence-sharded (its backward has a rule too)."""
    from autoplan.frontend import trace
    graph = trace("llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000,norm=layernorm",
                  seq=2048).blocks[0].graph
    bs = solve_block(graph, a100(8, sp=True))
    forward = [c for c in bs.collectives if c.phase == "forward" and c.nbytes >= 1e6]
    assert sorted(c.kind for c in forward) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert not big(bs, "all_reduce")
    _norms_sequence_sharded(graph, bs)


def _norms_sequence_sharded(graph, bs):
    norms = [n for n in graph.ops("forward") if "norm" in n.op]
    assert len(norms) == 2
    for n in norms:
        seq_dim = n.outputs[0].dim_roles.index("seq")
        assert bs.placements[n.name] == f"S({seq_dim})"


def test_sp_saves_activation_memory_and_time_scales_with_micro_batch(gpt_block, a100):
    ctx = a100(8, sp=False)
    a = solve_assignment(gpt_block, ctx)
    one = price_assignment(gpt_block, a, ctx)
    four = price_assignment(gpt_block, a, a100(8, sp=False, mbs=4))
    assert four.saved_bytes == pytest.approx(4 * one.saved_bytes, rel=1e-6)
    assert 3.0 < four.forward_s / one.forward_s <= 4.0       # bigger GEMMs run a little more efficiently
    sp = solve_block(gpt_block, a100(8, sp=True))
    assert sp.saved_bytes < 0.4 * one.saved_bytes


def test_layout_solved_without_recompute_stays_near_optimal_under_it(gpt_block, a100):
    """The estimator solves each block at the plan's micro-batch and cp without recomputation
    (a Layout holds one placement per block kind; recompute may differ per stage) and
    re-prices the layout under the stage's policy.  With full recompute at micro-batch 4 the
    re-priced layout must stay within 3 % of the layout solved with recomputation."""
    def total(bs):
        return bs.forward_s + bs.backward_s + bs.wgrad_s + bs.comm_seconds()
    other_ctx = a100(8, sp=True, mbs=4, recompute="full")
    ref = price_assignment(gpt_block, solve_assignment(gpt_block, a100(8, sp=True, mbs=4)), other_ctx)
    best = price_assignment(gpt_block, solve_assignment(gpt_block, other_ctx), other_ctx)
    assert total(best) <= total(ref) * 1.0001
    assert total(ref) <= 1.03 * total(best)


@pytest.mark.parametrize("sp, recompute", [(False, "none"), (True, "none"), (False, "selective"),
                                           (True, "selective"), (False, "full"), (True, "full")])
def test_saved_activations_match_korthikanti(gpt_eager_block, sp, recompute, a100):
    """Per-layer activation memory of the sharded traced block vs Korthikanti Table 2 (within 5 %)."""
    t, s, b, h, a = 8, 2048, 1, 6144, 64
    bs = solve_block(gpt_eager_block, a100(t, sp=sp, recompute=recompute))
    expected = korthikanti_layer_bytes(s=s, b=b, h=h, a=a, t=t, sp=sp, recompute=recompute)
    assert bs.saved_bytes == pytest.approx(expected, rel=0.05)


def test_ilp_size_and_solve_time_are_recorded(gpt_block, h100):
    bs = solve_block(gpt_block, h100(8, sp=True))
    assert bs.ilp_size["nodes"] < 120 and bs.ilp_size["x_vars"] > bs.ilp_size["nodes"]
    assert bs.gap == pytest.approx(0.0, abs=1e-9)


@pytest.fixture(scope="module")
def gqa_block():
    """GQA with 4 KV heads (32 query heads): fewer KV heads than tp=8 ranks."""
    from autoplan.frontend import trace
    return trace("llama:layers=2,hidden=4096,heads=32,kv_heads=4,ffn=14336,vocab=32000", seq=4096).blocks[0].graph


def test_gqa_with_fewer_kv_heads_than_tp_shards_query_heads_and_replicates_kv(gqa_block, h100):
    """DTensor shards q, k and v on heads alike, so kv_heads=4 < tp=8 leaves it no sharded
    attention; the ILP gets Megatron's replicated-KV strategy instead: query heads sharded,
    K and V replicated, their gradients partial sums.  The block's compute then keeps scaling
    from tp=4 (where DTensor's head sharding applies) to tp=8."""
    eight = solve_block(gqa_block, h100(8, sp=True))
    fwd, bwd = (n for n in gqa_block.nodes if n.op.startswith("aten._scaled_dot_product_flash_attention"))
    assert eight.strategies[fwd.name].endswith("<-S(1),R,R")
    assert eight.strategies[bwd.name].startswith("S(1),P,P<-")
    four = solve_block(gqa_block, h100(4, sp=True))

    def compute(bs):
        return bs.forward_s + bs.backward_s + bs.wgrad_s
    assert compute(eight) < 0.6 * compute(four)


def test_repricing_a_layout_equals_pricing_it_afresh(gpt_block, a100):
    """The layout's reads are derived once per assignment and re-priced per context: a second
    context priced after the first gives exactly what pricing it with a cold memo gives."""
    from autoplan.sharding import solve
    a = solve_assignment(gpt_block, a100(8, sp=True))
    contexts = [a100(8, sp=True), a100(8, sp=True, mbs=4, recompute="full"), a100(8, sp=True, mbs=2, cp=2)]
    warm = [price_assignment(gpt_block, a, ctx) for ctx in contexts]
    for ctx, got in zip(contexts, warm):
        solve._layout_reads.cache_clear()
        assert price_assignment(gpt_block, a, ctx) == got
    assert warm[1].recompute_s > 0 and any("[recompute]" in c.tensor for c in warm[1].collectives)
