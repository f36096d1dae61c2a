"""The pipeline engine's host time per send/receive instruction (``cost.pp.engine_instructions``,
profile ``p2p_host_s``: DeepSpeed's PipelineEngine)."""

from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.pp import engine_instructions
from autoplan.plan import Plan

MODEL = "gpt:layers=4,hidden=512,heads=16,vocab=1024,max_seq=512,attention=eager"


def test_each_stage_pays_once_per_boundary_in_forward_and_in_backward():
    f, b = engine_instructions([1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], 0.5)
    assert f == [1.5, 2.0, 2.0, 1.5]            # the end stages have one boundary, the inner two
    assert b == [2.5, 3.0, 3.0, 2.5]
    assert engine_instructions([1.0], [2.0], 0.5) == ([1.0], [2.0])        # no pipeline, no sends
    assert engine_instructions([1.0, 1.0], [2.0, 2.0], 0.0) == ([1.0, 1.0], [2.0, 2.0])


def _estimator(traced, profile_with, host_s: float):
    import topologies
    path, _ = profile_with("a100-megatron-deepspeed", p2p_host_s=host_s)
    return Estimator(traced(MODEL, seq=512), topologies.load("a100x8"), EstimateOptions(profile=path))


def test_a_two_stage_pipeline_pays_it_on_every_micro_batch(traced, profile_with):
    host_s = 1e-3
    with_engine, without = _estimator(traced, profile_with, host_s), _estimator(traced, profile_with, 0.0)
    pipe = Plan.parse("tp=1,pp=2,dp=4,mbs=1", num_gpus=8)
    m = 8                                        # global batch 32 over dp 4 at mbs 1
    extra = with_engine.estimate(pipe, 32).step_time_s - without.estimate(pipe, 32).step_time_s
    # 1F1B: each of the m micro-batches crosses the slower stage once forward and once backward
    # (+1 host_s each way), and the pipeline fill/drain adds up to (pp - 1) more of each
    assert m * 2 * host_s <= extra <= (m + 1) * 2 * host_s + 1e-9
    flat = Plan.parse("tp=1,pp=1,dp=8,mbs=1", num_gpus=8)
    assert with_engine.estimate(flat, 32).step_time_s == without.estimate(flat, 32).step_time_s
