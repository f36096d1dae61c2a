import pytest

from topologies import TopologyError, gpu_names, gpu_spec


def test_catalog_numbers_follow_calibration_runs():
    h100 = gpu_spec("h100")
    assert h100.bf16_flops == 989e12 and h100.fp8_flops == 1979e12
    assert h100.nvlink_bw == 450e9  # per direction: half of the datasheet's 900 GB/s
    assert gpu_spec("h800").nvlink_bw == 200e9  # 400 GB/s bidirectional
    assert gpu_spec("h200").hbm_bytes == 141e9
    assert gpu_spec("b200").hbm_bytes == 180e9 and gpu_spec("b200").bf16_flops == 2.25e15
    assert gpu_spec("gb200").hbm_bytes == 186e9 and gpu_spec("gb200").bf16_flops == 2.5e15
    assert gpu_spec("a100-40gb").hbm_bytes == 40e9
    assert gpu_spec("a100-80gb").fp8_flops is None


def test_aliases_and_case():
    assert gpu_spec("a100") is gpu_spec("a100-80gb")
    assert gpu_spec("H100") is gpu_spec("h100")
    assert {"a100-40gb", "a100-80gb", "h100", "h800", "h200", "b200", "gb200"} <= set(gpu_names())


def test_unknown_gpu_lists_the_kinds():
    with pytest.raises(TopologyError, match="unknown GPU kind 'v100'") as err:
        gpu_spec("v100")
    assert "h100" in err.value.fix and "gb200" in err.value.fix


def test_precisions_per_kind():
    assert gpu_spec("a100").precisions == ("bf16",)
    assert gpu_spec("a100-40gb").precisions == ("bf16",)
    for hopper in ("h100", "h800", "h200"):
        assert gpu_spec(hopper).precisions == ("bf16", "fp8", "fp8-rowwise", "fp8-delayed")
    for blackwell in ("b200", "gb200", "b300", "gb300"):
        assert gpu_spec(blackwell).precisions[-1] == "mxfp8"


def test_blackwell_ultra_kinds_from_nvidias_datasheets():
    """HGX B300 (per 8 GPUs: FP8 72, BF16 36 PFLOPS with sparsity) and GB300 NVL72 (per 72: FP8 720,
    BF16 360 PFLOPS with sparsity): dense per GPU is half the sparse share."""
    for kind, gpus, fp8_sparse, bf16_sparse in (("b300", 8, 72e15, 36e15), ("gb300", 72, 720e15, 360e15)):
        spec = gpu_spec(kind)
        assert spec.fp8_flops == fp8_sparse / gpus / 2 and spec.bf16_flops == bf16_sparse / gpus / 2
        assert spec.hbm_bw == 8e12 and spec.nvlink_bw == 900e9 and 250e9 < spec.hbm_bytes <= 288e9
