"""The GPU catalog: ``GPUSpec`` per GPU kind, read from ``topologies/gpus.yaml``.

>>> gpu_spec("h100").nvlink_bw
450000000000.0
"""
from __future__ import annotations

import dataclasses
import functools

from topologies._data import read_yaml
from topologies.errors import TopologyError


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """Peak numbers of one GPU kind (dense, no sparsity)."""

    name: str
    """Canonical kind name, e.g. ``"h100"`` (aliases such as ``"a100"`` resolve to one)."""
    bf16_flops: float
    """Peak dense BF16 tensor throughput, FLOP/s."""
    fp8_flops: float | None
    """Peak dense FP8 tensor throughput, FLOP/s; ``None`` where the GPU has no FP8 (A100)."""
    hbm_bytes: float
    """HBM capacity, bytes (spec-sheet decimal GB x 1e9; usable figure for B200/GB200)."""
    hbm_bw: float
    """HBM bandwidth, bytes/s."""
    nvlink_bw: float
    """NVLink bandwidth per GPU, bytes/s, PER DIRECTION (half the datasheet's bidirectional sum)."""
    block_fp8: bool = False
    """Block-scaled FP8 (MXFP8: an E8M0 scale per 32 elements) in the tensor cores (Blackwell)."""

    @property
    def precisions(self) -> tuple[str, ...]:
        """The plan precisions (``autoplan.plan.PRECISIONS``) this GPU runs: bf16 everywhere, the
        FP8 recipes where it has FP8 tensor cores, MXFP8 where they take block scales."""
        fp8 = ("fp8", "fp8-rowwise", "fp8-delayed") if self.fp8_flops else ()
        return ("bf16",) + fp8 + (("mxfp8",) if self.block_fp8 and self.fp8_flops else ())


@functools.lru_cache(maxsize=None)
def _catalog() -> dict[str, GPUSpec]:
    raw = read_yaml("gpus.yaml")
    specs = {}
    for name, entry in raw.items():
        if name == "aliases":
            continue
        fp8 = entry["fp8_flops"]
        specs[name] = GPUSpec(name=name, bf16_flops=float(entry["bf16_flops"]),
                              fp8_flops=None if fp8 is None else float(fp8),
                              hbm_bytes=float(entry["hbm_bytes"]), hbm_bw=float(entry["hbm_bw"]),
                              nvlink_bw=float(entry["nvlink_bw"]), block_fp8=bool(entry.get("block_fp8", False)))
    for alias, target in raw.get("aliases", {}).items():
        specs[alias] = specs[target]
    return specs


def gpu_names() -> list[str]:
    """Every accepted GPU kind name, aliases included, sorted."""
    return sorted(_catalog())


def gpu_spec(name: str) -> GPUSpec:
    """The ``GPUSpec`` for a kind name or alias (case-insensitive); ``TopologyError`` if unknown."""
    spec = _catalog().get(name.strip().lower())
    if spec is None:
        raise TopologyError(f"unknown GPU kind {name!r}",
                            f"use one of: {', '.join(gpu_names())}")
    return spec
