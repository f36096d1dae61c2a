"""FP8 memory as the engines hold it (``cost.fp8``, ``costmodels.precision``): Transformer Engine's
FP8 linear inputs and cached FP8 weight copies, FP8 parameters, delayed scaling's amax histories,
torchao's bf16 inputs; and the published FP8 layouts that ran fit."""
import dataclasses

import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.precision import AMAX_HISTORY_LEN, AMAX_TENSORS_PER_GEMM

MODEL = "llama:layers=2,hidden=1024,heads=8,kv_heads=8,ffn=4096,vocab=32000"
SEQ, HIDDEN, FFN, LAYERS = 2048, 1024, 4096, 2
LINEAR = HIDDEN * HIDDEN * 4 + HIDDEN * FFN * 3          # q, k, v, o; gate, up, down


def _block(est, precision: str, plan: str = "dp=8"):
    p = Plan.parse(f"{plan},precision={precision}", num_gpus=8)
    return est.part("dense0", p, "none", Mesh.of(p))


def _params(est, precision: str, plan: str = "dp=8") -> float:
    return est.memory_by_rank(Plan.parse(f"{plan},precision={precision}", num_gpus=8), 8)[0].params


def test_transformer_engine_keeps_fp8_linear_inputs(setup):
    """Per layer and micro-batch, against the bf16 trace: the q/k/v input (s·h), the gate/up input
    (s·h) and the down projection's input (s·ffn) kept at 1 byte instead of 2; the o-projection's
    input stays bf16 (flash attention keeps it) and its FP8 cast comes beside it (+s·h):
    −s·(h + ffn) bytes."""
    _, _, est = setup(MODEL, "h100x8")
    bf16, fp8 = _block(est, "bf16"), _block(est, "fp8")
    assert fp8.saved_bytes - bf16.saved_bytes == -SEQ * (HIDDEN + FFN)
    assert _block(est, "fp8-rowwise").saved_bytes == fp8.saved_bytes    # a scale per row: not per element


def test_mxfp8_inputs_carry_their_block_scales(setup):
    _, _, est = setup(MODEL, "b200x8")
    bf16, mx = _block(est, "bf16"), _block(est, "mxfp8")
    fp8_bytes = 1 + 1 / 32
    kept = SEQ * (HIDDEN + HIDDEN + FFN)                     # cast instead of bf16: q/k/v, gate/up, down inputs
    beside = SEQ * HIDDEN                                    # cast beside the bf16: the o-projection's input
    assert mx.saved_bytes - bf16.saved_bytes == pytest.approx(kept * (fp8_bytes - 2) + beside * fp8_bytes)


def test_torchao_keeps_the_bf16_inputs_and_no_weight_copies(setup):
    model, cluster, _ = setup(MODEL, "h100x8")
    est = Estimator(model, cluster, EstimateOptions(fp8_engine="torchao"))
    assert _block(est, "fp8").saved_bytes == _block(est, "bf16").saved_bytes
    assert _params(est, "fp8") == _params(est, "bf16")


def test_transformer_engine_caches_an_fp8_weight_and_its_transpose(setup):
    """Zero 0/1: 2 bytes per linear weight element beside the bf16 weight; with FP8 parameters
    (--fp8-param-gather) the FP8 weight and its transpose replace it: nothing more; under FSDP
    (zero 3, no cache) the FP8 transpose each layer saves for backward: 1 byte."""
    model, cluster, est = setup(MODEL, "h100x8")
    assert _block(est, "fp8").fp8_weight_numel == LINEAR and _block(est, "fp8").fp8_gemms == 7
    assert _params(est, "fp8") - _params(est, "bf16") == 2 * LINEAR * LAYERS
    fp8_params = Estimator(model, cluster, EstimateOptions(fp8_params=True))
    assert _params(fp8_params, "fp8") == _params(fp8_params, "bf16")
    zero3 = "dp=8,zero=3"
    assert _params(est, "fp8", zero3) - _params(est, "bf16", zero3) == LINEAR * LAYERS


def test_delayed_scaling_keeps_amax_histories(setup):
    _, _, est = setup(MODEL, "h100x8")
    per_gemm = 4 * AMAX_HISTORY_LEN * AMAX_TENSORS_PER_GEMM
    assert _params(est, "fp8-delayed") - _params(est, "fp8") == 7 * LAYERS * per_gemm


def test_fp8_parameters_are_gathered_in_one_byte(setup):
    model, cluster, _ = setup(MODEL, "h100x8")
    gathered = {}
    for fp8_params in (False, True):
        est = Estimator(model, cluster, EstimateOptions(fp8_params=fp8_params))
        e = est.estimate(Plan.parse("dp=8,zero=1,precision=fp8", num_gpus=8), 8)
        gathered[fp8_params] = sum(p.bytes_per_call for p in e.primitives if p.kind == "all_gather" and p.axis == "dp")
    assert gathered[True] == gathered[False] / 2     # every parameter at 1 byte (the bf16 embeddings: an undercount)


LLAMA3_70B = "llama:layers=80,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256"
BRIDGE = EstimateOptions(kernels="megatron-core", state_precision="megatron-bf16-grads", grad_reduce_bytes=2.0,
                         fp8_params=True)


def test_megatron_bridge_llama3_70b_fp8_layout_fits(setup):
    """Megatron-Bridge 26.04 ran Llama 3 70B in FP8 at TP4 PP8 VPP5 on 64 H100 80GB (its recipe:
    Megatron-Core kernels, bf16 main gradients, FP8 parameters): it fits, with the FP8 inputs'
    saving; the same layout in bf16 with the default fp32 gradients does not."""
    model, cluster, _ = setup(LLAMA3_70B, "h100x64", seq=8192)
    plan = "tp=4,pp=8,vpp=5,dp=2,mbs=1,schedule=interleaved"
    bridge = Estimator(model, cluster, BRIDGE)
    fp8 = bridge.estimate(Plan.parse(plan + ",precision=fp8", num_gpus=64), 256, detail=False)
    bf16 = bridge.estimate(Plan.parse(plan, num_gpus=64), 256, detail=False)
    assert fp8.fits and fp8.memory_gib < bf16.memory_gib - 5
    default = Estimator(model, cluster).estimate(Plan.parse(plan, num_gpus=64), 256, detail=False)
    assert not default.fits


def test_tp_comm_overlap_hides_the_sequence_parallel_collectives_behind_their_gemms(setup):
    """Userbuffers overlap (Megatron-Core + TE --tp-comm-overlap): at hidden 8192 and tp 4 the SP
    all-gathers and reduce-scatters of a layer take less than its GEMMs, so none stays exposed;
    the collectives themselves are unchanged."""
    model, cluster, _ = setup(LLAMA3_70B, "h100x64", seq=8192)
    plan = Plan.parse("tp=4,pp=8,vpp=5,dp=2,mbs=1,schedule=interleaved,precision=fp8", num_gpus=64)
    off = Estimator(model, cluster, BRIDGE).estimate(plan, 256)
    on = Estimator(model, cluster, dataclasses.replace(BRIDGE, tp_comm_overlap=True)).estimate(plan, 256)
    sp_off, sp_on = ([(p.kind, p.time_s, p.exposed_s) for p in e.primitives if p.axis == "tp" and p.traffic == "sp"]
                     for e in (off, on))
    assert [k for k, _, _ in sp_off] == [k for k, _, _ in sp_on] and sp_off
    assert all(t_on == t_off for (_, t_off, _), (_, t_on, _) in zip(sp_off, sp_on))
    assert all(x == 0 for _, _, x in sp_on) and sum(x for _, _, x in sp_off) > 2.0
    assert on.step_time_s < off.step_time_s - 2.0
