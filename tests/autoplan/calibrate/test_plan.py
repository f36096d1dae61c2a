"""autoplan/calibrate/plan.py: the shapes calibrate times."""
from autoplan.calibrate.plan import COPY_BYTES, TOKENS, AttentionShape, GemmShape, gemm_dims, measurement_plan


def test_plan_is_deterministic_and_ordered():
    assert measurement_plan() == measurement_plan()
    assert measurement_plan(quick=True) == measurement_plan(quick=True)
    gemms = measurement_plan().gemms
    assert list(gemms) == sorted(gemms, key=lambda s: (s.m, s.n, s.k)) and len(set(gemms)) == len(gemms)


def test_full_plan_covers_the_cost_models_shapes():
    plan = measurement_plan()
    dims = gemm_dims()
    assert dims == (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
    assert len(plan.gemms) == len(TOKENS) * len(dims) ** 2 == 845
    assert {s.m for s in plan.gemms} == {1024, 2048, 4096, 8192, 16384}
    assert GemmShape(16384, 128, 16384) in plan.gemms          # a skinny, memory-bound one
    assert GemmShape(4096, 12288 // 8, 12288) in plan.gemms    # GPT-3 175B proj at tp 8
    assert {(a.heads, a.head_dim) for a in plan.attention} == {(8, 128), (16, 128), (32, 128)}
    assert {a.seq for a in plan.attention} == {2048, 4096, 8192, 16384, 32768}
    assert all(a.batch * a.seq >= 16384 for a in plan.attention)
    assert {a.causal for a in plan.attention} == {True, False} and len(plan.attention) == 30
    assert plan.copy_bytes == COPY_BYTES and max(COPY_BYTES) >= 2**30


def test_quick_plan_is_a_small_subset():
    full, quick = measurement_plan(), measurement_plan(quick=True)
    assert set(quick.gemms) <= set(full.gemms) and len(quick.gemms) == 50
    assert set(quick.attention) <= set(full.attention)
    assert quick.attention == (AttentionShape(8, 16, 2048, 128, True), AttentionShape(2, 16, 8192, 128, True))
    assert set(quick.copy_bytes) <= set(full.copy_bytes) and quick.tiny_kernels == full.tiny_kernels
