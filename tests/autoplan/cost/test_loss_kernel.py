"""The loss kernel (EstimateOptions.loss_kernel): a fused softmax-cross-entropy on the bf16 logits
keeps them and the fp32 log-sum-exp instead of the fp32 log-softmax, its backward writes one bf16
gradient of the logits, and it runs as two memory-bound kernels instead of the traced ops."""
import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.errors import UserError
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.compute import load_profile, op_time

GPT = "gpt:layers=2,hidden=256,heads=4,vocab=1024"
SEQ, VOCAB = 512, 1024
TRACED_LOSS_OPS = {  # what F.cross_entropy on fp32 logits traces to, by phase
    "forward": {"aten._to_copy.default", "aten._log_softmax.default", "aten.nll_loss_forward.default"},
    "backward": {"aten.nll_loss_backward.default", "aten._log_softmax_backward_data.default",
                 "aten._to_copy.default"},
}


def post(setup, loss_kernel, plan_text, profile=None):
    """(the @post part, the last stage's loss buffers, the Estimator) of GPT under ``plan_text``."""
    graph, cluster, _ = setup(GPT, "h100x8", seq=SEQ)
    est = Estimator(graph, cluster, EstimateOptions(loss_kernel=loss_kernel, profile=profile))
    plan = Plan.parse(plan_text)
    mesh = Mesh.of(plan)
    return est.part("@post", plan, "none", mesh), est.memory_inputs(plan, mesh, 1)["loss"], est


@pytest.mark.parametrize("plan_text,tp,mbs", [("dp=8,zero=1,mbs=2", 1, 2), ("tp=2,dp=4,sp=on,mbs=2", 2, 2)])
def test_fused_loss_keeps_bf16_logits_and_lse_instead_of_the_fp32_log_softmax(setup, plan_text, tp, mbs):
    eager, eager_loss, _ = post(setup, "eager", plan_text)
    fused, fused_loss, _ = post(setup, "fused", plan_text)
    logits, tokens = mbs * SEQ * VOCAB / tp, mbs * SEQ     # local logits (vocabulary-parallel head), tokens
    # eager keeps the fp32 log-softmax (4 B per logit) and NLL's two fp32 scalars (loss, total weight);
    # fused keeps the bf16 logits (2 B) and one fp32 log-sum-exp per token
    assert eager.saved_bytes - fused.saved_bytes == pytest.approx(4 * logits + 2 * 4 - (2 * logits + 4 * tokens))
    # loss backward: two fp32 gradients (three under tp's loss_parallel) against one bf16 gradient
    assert eager_loss == pytest.approx(logits * (8 if tp == 1 else 12))
    assert fused_loss == pytest.approx(2 * logits)
    # a split backward frees the kernel's saved bytes at B, as it freed the log-softmax
    assert eager.b_freed_bytes - fused.b_freed_bytes == pytest.approx(4 * logits - (2 * logits + 4 * tokens))
    assert (fused.dense_numel, fused.model_flops) == (eager.dense_numel, eager.model_flops)


def test_fused_loss_is_priced_as_two_memory_bound_kernels(setup, profile_with):
    path, data = profile_with("h100", host_floor_s=0.0)     # GPU seconds, no launch floor
    mbs = 2
    eager, _, est = post(setup, "eager", f"dp=8,zero=1,mbs={mbs}", path)
    fused, _, _ = post(setup, "fused", f"dp=8,zero=1,mbs={mbs}", path)
    gpu, profile = est.cluster.gpu, load_profile("h100", path)

    def traced(phase):  # the eager loss ops' seconds, each priced as the roofline prices a memory op
        return sum(op_time("memory", n.flops * mbs, (n.bytes_read + n.bytes_written) * mbs,
                           peak_flops=gpu.bf16_flops, hbm_bw=gpu.hbm_bw, profile=profile)
                   for n in est.model.post.ops(phase) if n.op in TRACED_LOSS_OPS[phase])

    logit_bytes = mbs * SEQ * VOCAB * 2                      # the bf16 logits
    bw = gpu.hbm_bw * data["memory_fraction"]
    kernel_f = logit_bytes / bw + data["overhead_s"]         # reads the logits once
    kernel_b = 2 * logit_bytes / bw + data["overhead_s"]     # reads them, writes their gradient
    assert eager.forward_s - fused.forward_s == pytest.approx(traced("forward") - kernel_f, rel=1e-9)
    assert eager.backward_s - fused.backward_s == pytest.approx(traced("backward") - kernel_b, rel=1e-9)


def test_blocks_have_no_loss_to_fuse(setup):
    graph, cluster, _ = setup(GPT, "h100x8", seq=SEQ)
    plan = Plan.parse("dp=8,zero=1")
    parts = [Estimator(graph, cluster, EstimateOptions(loss_kernel=k)).part(graph.blocks[0].kind, plan, "none",
                                                                           Mesh.of(plan)) for k in ("eager", "fused")]
    assert parts[0] == parts[1]


def test_fused_loss_with_megatron_cores_own_loss_is_refused():
    with pytest.raises(UserError, match="megatron-core") as err:
        EstimateOptions(kernels="megatron-core", loss_kernel="fused")
    assert "--loss-kernel eager" in err.value.fix


def test_unknown_loss_kernel_is_a_user_error():
    with pytest.raises(UserError, match="unknown loss kernel 'liger'"):
        EstimateOptions(loss_kernel="liger")
