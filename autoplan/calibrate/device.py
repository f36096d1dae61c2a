"""Which GPU is this: is CUDA there, and which ``topologies`` catalog kind matches its name.

The catalog kind supplies the peak BF16 FLOP/s and HBM bandwidth that measured times are divided
by, so a wrong guess would skew every fraction: names that do not match a known SXM part exactly
(PCIe and NVL cards have other clocks and bandwidths) map to nothing, and the user passes ``--gpu``.
"""
from __future__ import annotations

import re

# (pattern on torch.cuda.get_device_name(), catalog kind), first match wins.
_DEVICE_NAMES = (
    (r"^NVIDIA H100 80GB HBM3$", "h100"),
    (r"^NVIDIA H800$", "h800"),
    (r"^NVIDIA H200$", "h200"),
    (r"^NVIDIA A100-SXM4-80GB$", "a100-80gb"),
    (r"^NVIDIA A100-SXM4-40GB$", "a100-40gb"),
    (r"^NVIDIA B200$", "b200"),
    (r"^NVIDIA GB200$", "gb200"),
)


def catalog_gpu_name(device_name: str) -> str | None:
    """The catalog kind for a CUDA device name, e.g. "NVIDIA H100 80GB HBM3" → "h100"; None if unknown."""
    for pattern, kind in _DEVICE_NAMES:
        if re.match(pattern, device_name.strip(), flags=re.IGNORECASE):
            return kind
    return None


def cuda_device_name() -> str | None:
    """``torch.cuda.get_device_name()`` of the current device, or None without a usable CUDA GPU."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())
