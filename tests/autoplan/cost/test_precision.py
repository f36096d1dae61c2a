"""FP8 plans priced: linear GEMMs at the FP8 peak plus their casts, the rest bf16."""
import pytest

from autoplan.axes import Axis
from autoplan.cost.prices import AxisPricer
from autoplan.cost.tp import gemm_precision
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.opkinds import is_attention_core
from autoplan.plan import Plan
from autoplan.sharding.price import node_seconds
from autoplan.sharding.strategies import replicated
from autoplan.sharding.types import ShardingContext
from costmodels.precision import gemm_cast_bytes

MODEL = "llama:layers=2,hidden=1024,heads=8,kv_heads=8,ffn=4096,vocab=32000"


def _ctx(est, plan, precision):
    return ShardingContext(tp=1, sp=False, pricer=AxisPricer(est.prices, Mesh.of(plan)), precision=precision)


def test_a_linear_gemm_is_priced_at_the_fp8_peak_with_its_casts_and_attention_stays_bf16(setup):
    model, _, est = setup(MODEL, "h100x8")
    plan = Plan.parse("dp=8", num_gpus=8)
    graph = model.blocks[0].graph
    gemms = [n for n in graph.ops() if n.gemm is not None and not is_attention_core(n)]
    assert gemms
    n = gemms[0]
    bf16, fp8 = (node_seconds(n, replicated(n), _ctx(est, plan, p)) for p in ("bf16", "fp8-delayed"))
    m, nn, k = n.gemm
    gemm = (max(m, 1.0), max(nn, 1.0), max(k, 1.0))
    nbytes = n.bytes_read + n.bytes_written
    assert bf16 == est.prices.op_seconds("gemm", n.flops, nbytes, gemm)
    assert n.out is not None and "tokens" in n.out.dim_roles or "seq" in n.out.dim_roles    # a forward GEMM
    assert fp8 == (est.prices.op_seconds("gemm_fp8", n.flops, nbytes, gemm)
                   + est.prices.op_seconds("cast", 0.0, gemm_cast_bytes("fp8-delayed", gemm[0], gemm[2], True), None))
    for other in (x for x in graph.ops() if x.gemm is None or is_attention_core(x)):
        assert (node_seconds(other, replicated(other), _ctx(est, plan, "bf16"))
                == node_seconds(other, replicated(other), _ctx(est, plan, "fp8")))


def test_the_head_and_embedding_stay_bf16():
    plan = Plan.parse("dp=8,precision=fp8", num_gpus=8)
    assert [gemm_precision(g, plan) for g in ("@pre", "block", "@post")] == ["bf16", "fp8", "bf16"]


BIG = "llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000"


def test_fp8_pays_on_large_gemms_and_not_on_small_ones(setup):
    """hidden 4096: the GEMMs halve, attention, norms and casts do not: faster, not twice.  hidden
    1024 at 2,048 tokens: the casts cost more than the GEMMs save, as small FP8 layers do."""
    _, _, est = setup(BIG, "h100x8")
    bf16 = est.estimate(Plan.parse("tp=2,dp=4", num_gpus=8), 32)
    fp8 = est.estimate(Plan.parse("tp=2,dp=4,precision=fp8", num_gpus=8), 32)
    assert 1.1 < bf16.step_time_s / fp8.step_time_s < 1.6
    assert fp8.model_flops_per_step == bf16.model_flops_per_step     # the same work, faster
    _, _, small = setup(MODEL, "h100x8")
    assert (small.estimate(Plan.parse("tp=2,dp=4,precision=fp8", num_gpus=8), 32).step_time_s
            > small.estimate(Plan.parse("tp=2,dp=4", num_gpus=8), 32).step_time_s)


def test_zero3_fp8_gathers_block_weights_in_one_byte(setup):
    """FSDP2's float8 all-gather moves the blocks' weights in 1 byte; the root unit (embedding,
    final norm, head: not float8 linears) is gathered in bf16, once per micro-batch's forward."""
    _, _, est = setup(MODEL, "h100x8")
    bytes_ = {}
    for precision in ("bf16", "fp8"):
        plan = Plan.parse(f"dp=8,zero=3,precision={precision}", num_gpus=8)
        e = est.estimate(plan, 32)
        bytes_[precision] = sum(c.bytes_per_call * c.calls_per_step for c in e.primitives
                                if c.kind == "all_gather" and c.axis == Axis.DP.value)
    parts = est.counted_parts(plan, Mesh.of(plan))              # ..., @pre, @post
    root = 2.0 * sum(p.dense_numel for p, _ in parts[-2:]) * e.microbatches
    assert bytes_["fp8"] == pytest.approx(root + (bytes_["bf16"] - root) / 2)
    assert root < bytes_["fp8"] < bytes_["bf16"]


def test_fp8_on_a100_is_refused(setup):
    _, _, est = setup(MODEL, "a100x8")
    with pytest.raises(UserError, match="needs FP8 tensor cores"):
        est.estimate(Plan.parse("dp=8,precision=fp8", num_gpus=8), 32)


def test_fp8_plans_send_the_bf16_activations_the_trace_records(setup):
    """FP8 is the linear GEMMs' precision: the activations between them stay bf16 as traced, so a
    stage boundary and the cp sends move the bf16 plan's bytes (``PlanContext.activation_bytes``,
    ``cp.attention_bytes``: 2 bytes an element)."""
    _, _, est = setup(MODEL, "h100x8")
    sends = {}
    for precision in ("bf16", "fp8"):
        e = est.estimate(Plan.parse(f"tp=1,cp=2,pp=2,dp=2,precision={precision}", num_gpus=8), 32)
        sends[precision] = sorted((p.traffic, p.kind, p.bytes_per_call) for p in e.primitives
                                  if p.traffic in ("pp", "cp"))
    assert est.activation_bytes == 2
    assert {t for t, _, _ in sends["bf16"]} == {"pp", "cp"}
    assert sends["fp8"] == sends["bf16"]


def _parts(setup, precision: str, recompute: str, fp8_recompute: str, plan: str = "dp=8", model: str = MODEL):
    from autoplan.cost import EstimateOptions, Estimator

    model, cluster, _ = setup(model, "h100x8")
    est = Estimator(model, cluster, EstimateOptions(fp8_recompute=fp8_recompute))
    p = Plan.parse(f"{plan},precision={precision}", num_gpus=8)
    return est.part("dense0", p, recompute, Mesh.of(p))


@pytest.mark.parametrize("plan", ["dp=8", "tp=2,dp=4,sp=on"])
def test_a_torch_checkpoint_reruns_fp8_layers_and_their_backward_in_bf16(setup, plan):
    """Transformer Engine under a framework checkpoint (``fp8_recompute=bf16``, Composer's torch
    checkpoint_wrapper): only the first forward runs in FP8.  So under full recomputation the
    FP8 plan's forward costs what the FP8 plan's does, and its backward (recompute included) and
    weight gradients what the bf16 plan's do; with TE's own checkpoint all three are the FP8 plan's."""
    fp8 = _parts(setup, "fp8-delayed", "full", "fp8", plan)
    bf16 = _parts(setup, "bf16", "full", "fp8", plan)
    outside = _parts(setup, "fp8-delayed", "full", "bf16", plan)
    assert outside.forward_s == fp8.forward_s
    assert (outside.backward_s, outside.wgrad_s) == (bf16.backward_s, bf16.wgrad_s)
    assert (fp8.backward_s, fp8.wgrad_s) != (bf16.backward_s, bf16.wgrad_s)     # the check can fail
    assert outside.saved_bytes == fp8.saved_bytes


def test_without_a_recomputed_linear_layer_the_checkpoint_changes_nothing(setup):
    """No recomputation, or Megatron's selective (the attention core only): no linear layer reruns,
    so every GEMM runs where its forward did, in FP8."""
    for recompute in ("none", "selective"):
        a, b = (_parts(setup, "fp8-delayed", recompute, r) for r in ("fp8", "bf16"))
        assert (a.forward_s, a.backward_s, a.wgrad_s) == (b.forward_s, b.backward_s, b.wgrad_s)


def test_op_recompute_reruns_in_bf16_only_the_layers_it_recomputes(setup):
    """torch's ``op`` policy keeps every other matmul: the layers it reruns (and their backward)
    fall back to bf16, the others stay FP8, so at a width where FP8 wins on every GEMM the backward
    lies strictly between the two."""
    wide = "llama:layers=1,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000"
    fp8, bf16, outside = (_parts(setup, p, "op", r, model=wide)
                          for p, r in (("fp8", "fp8"), ("bf16", "fp8"), ("fp8", "bf16")))
    assert outside.forward_s == fp8.forward_s
    low, high = sorted((fp8.backward_s + fp8.wgrad_s, bf16.backward_s + bf16.wgrad_s))
    assert low < outside.backward_s + outside.wgrad_s < high


def test_bf16_recompute_needs_transformer_engine():
    from autoplan.cost import EstimateOptions

    with pytest.raises(UserError, match="Transformer Engine"):
        EstimateOptions(fp8_engine="torchao", fp8_recompute="bf16")
