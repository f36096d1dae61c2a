"""autoplan/calibrate/device.py: CUDA device names to catalog GPU kinds."""
import pytest

import topologies
from autoplan.calibrate.device import catalog_gpu_name


@pytest.mark.parametrize("device, kind", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H800", "h800"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
])
def test_known_sxm_parts_map_to_catalog_kinds(device, kind):
    assert catalog_gpu_name(device) == kind
    assert topologies.gpu_spec(kind).name == kind


@pytest.mark.parametrize("device", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100 80GB PCIe",
                                    "NVIDIA GeForce RTX 4090", "NVIDIA GH200 480GB", ""])
def test_other_parts_are_not_guessed(device):
    assert catalog_gpu_name(device) is None
