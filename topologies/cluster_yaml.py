"""Cluster YAML files: the schema, reading (with defaults) and writing.

Schema (one mapping; only ``gpu`` and ``num_gpus`` are required)::

    name: selene                # default: the file name without .yaml
    description: "..."          # default: generated from the hardware
    gpu: a100-80gb              # GPU kind from topologies/gpus.yaml (aliases allowed: a100)
    gpu_hbm_bytes: 96.0e9       # optional: this cluster's parts differ from the catalog kind
    gpu_hbm_bw: 2.4e12          #   (HBM size, HBM bytes/s, power-limited dense BF16 FLOP/s),
    gpu_bf16_flops: 989.0e12    #   e.g. torchtitan's Grand Teton H100s: 96 GB HBM2e at 500 W
    gpu_nvlink_bw: 200.0e9      #   NVLink bytes/s per direction per GPU: the export parts' cap
                                #   (A800: 400 GB/s bidirectional, 8 of A100's 12 links; H800)
    num_gpus: 4480              # multiple of nvlink_domain (and so of gpus_per_node)

    # node and NVLink          default: topologies/systems.yaml for the GPU kind
    gpus_per_node: 8            # GPUs sharing one node's NICs (GB200: 4 per compute tray)
    nvlink_domain: 8            # GPUs per NVLink domain (GB200 NVL72: 72), multiple of gpus_per_node
    nvls: false                 # NVLink SHARP in-switch all-reduce

    # scale-out network         default: systems.yaml, then network.yaml
    nics_per_node: 8            # compute NICs per node
    nic: hdr200                 # NIC kind in network.yaml (hdr200, ndr400): sets nic_bw, nic_efficiency
    nic_bw: 25.0e9              # line rate per NIC, bytes/s per direction (overrides the kind)
    fabric: IB                  # display name: IB or RoCE
    leaf_nodes: 20              # nodes per rail group (rail leaf switches shared), multiple of
                                #   nvlink_domain / gpus_per_node
    pod_size: 1120              # GPUs per non-blocking pod, multiple of leaf_nodes * gpus_per_node
    pod_oversubscription: 1.0   # x in 1:x above the pods (Llama 3's cluster: 7.0)
    sharp: false                # InfiniBand SHARP in-network all-reduce

    # physical calibration      default: systems.yaml for the GPU kind (NVLink generation), else
                                #   topologies/network.yaml (edit there for all clusters)
    nic_efficiency: 0.96        # fraction of nic_bw NCCL achieves per NIC
    nvlink_efficiency: 0.822    # ring busbw / nvlink_bw
    nvls_efficiency: 0.686      # NVLS all-reduce algbw / (nvlink_bw * k/(k+1))
    launch_latency: 6.0e-6      # seconds per collective call
    nvlink_latency: 1.0e-6      # seconds per algorithm step, per level
    rail_latency: 5.0e-6
    spine_latency: 6.0e-6
    pod_latency: 8.0e-6

Unknown keys are rejected (a misspelt key would otherwise silently fall back to a default).
Every number must be finite and in its ``RANGES`` row (efficiencies in (0, 1], latencies
under a second, ``pod_oversubscription`` >= 1, counts up to 2^24); a file is at most
``MAX_FILE_BYTES`` of UTF-8 YAML; values quoted in messages are cut short (an alias bomb is
never expanded).
``to_mapping`` writes every key, so ``from_mapping(to_mapping(c)) == c``.
"""
from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from topologies._data import read_yaml
from topologies.cluster import Cluster
from topologies.errors import TopologyError
from topologies.gpus import GPUSpec, gpu_spec
from topologies.strict_load import DuplicateKey, load_yaml

INT_KEYS = ("num_gpus", "gpus_per_node", "nvlink_domain", "nics_per_node", "leaf_nodes", "pod_size")
FLOAT_KEYS: tuple[str, ...] = ("nic_bw", "nic_efficiency", "pod_oversubscription", "nvlink_efficiency",
                               "nvls_efficiency", "launch_latency", "nvlink_latency", "rail_latency",
                               "spine_latency", "pod_latency")
BOOL_KEYS = ("nvls", "sharp")
GPU_OVERRIDES = {"gpu_hbm_bytes": "hbm_bytes", "gpu_hbm_bw": "hbm_bw", "gpu_bf16_flops": "bf16_flops",
                 "gpu_nvlink_bw": "nvlink_bw"}
"""Cluster keys that override a field of the catalog GPUSpec (key -> GPUSpec field)."""
FLOAT_KEYS = FLOAT_KEYS + tuple(GPU_OVERRIDES)
CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(Cluster))
KEYS = CLUSTER_KEYS[:3] + tuple(GPU_OVERRIDES) + CLUSTER_KEYS[3:]
"""Every accepted key, in schema order (the Cluster fields, ``gpu`` a kind name, then the
optional GPU overrides)."""

MAX_FILE_BYTES = 1 << 20
MAX_COUNT = 1 << 24
RANGES = {  # float key -> (lowest, highest, lowest allowed itself?)
    "nic_bw": (0.0, 1e13, False),              # bytes/s per direction: up to 10 TB/s
    "nic_efficiency": (0.0, 1.0, False),
    "nvlink_efficiency": (0.0, 1.0, False),
    "nvls_efficiency": (0.0, 1.0, False),
    "pod_oversubscription": (1.0, 1e3, True),  # x in 1:x
    "launch_latency": (0.0, 1.0, True),        # seconds
    "nvlink_latency": (0.0, 1.0, True),
    "rail_latency": (0.0, 1.0, True),
    "spine_latency": (0.0, 1.0, True),
    "pod_latency": (0.0, 1.0, True),
    "gpu_hbm_bytes": (0.0, 1e14, False),       # bytes: up to 100 TB
    "gpu_hbm_bw": (0.0, 1e14, False),          # bytes/s
    "gpu_bf16_flops": (0.0, 1e17, False),      # FLOP/s
    "gpu_nvlink_bw": (0.0, 1e13, False),       # bytes/s per direction
}

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 2
_SHORT.maxlist = _SHORT.maxdict = 4

_NETWORK_DEFAULTS = {  # cluster key -> (section, key) in network.yaml
    "nvlink_efficiency": ("nvlink", "ring_efficiency"),
    "nvls_efficiency": ("nvlink", "nvls_efficiency"),
    "launch_latency": ("latency", "launch"),
    "nvlink_latency": ("latency", "nvlink"),
    "rail_latency": ("latency", "rail"),
    "spine_latency": ("latency", "spine"),
    "pod_latency": ("latency", "pod"),
}


def nic_kinds() -> list[str]:
    """NIC kinds defined in network.yaml, sorted."""
    return sorted(read_yaml("network.yaml")["nics"])


def read_file(path: Path) -> Any:
    """The parsed cluster YAML at ``path`` (None for an empty file); TopologyError if it is too
    big, not UTF-8 text or not YAML."""
    fix = "start from `autoplan clusters h100x1024 --yaml`"
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise TopologyError(f"{path}: {size:,} bytes is more than a cluster file holds "
                                f"({MAX_FILE_BYTES:,})", fix)
        text = path.read_bytes().decode("utf-8")
        return load_yaml(text)
    except DuplicateKey as err:
        raise TopologyError(f"{path}: {err}", "keep one of them") from None
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not a text file (not UTF-8)", fix) from None
    except yaml.YAMLError as err:
        raise TopologyError(f"{path}: not valid YAML ({_SHORT.repr(str(err))})", "fix the YAML syntax") from None
    except RecursionError:
        raise TopologyError(f"{path}: nested too deeply to be a cluster file", fix) from None
    except OSError as err:
        raise TopologyError(f"{path}: cannot read it ({err.strerror})", "give a readable cluster YAML file") from None


def from_mapping(raw: Mapping[str, Any], *, default_name: str, source: str) -> Cluster:
    """Build a Cluster from a parsed cluster YAML, filling missing keys with defaults.

    ``source`` names the file (or shorthand) in error messages.  Raises ``TopologyError``.
    """
    if not isinstance(raw, Mapping):
        raise TopologyError(f"{source}: a cluster file must be a YAML mapping of keys to values",
                            "start from `autoplan clusters h100x1024 --yaml`")
    unknown = sorted(_SHORT.repr(k) if not isinstance(k, str) else k[:60] for k in raw if k not in KEYS)
    if unknown:
        raise TopologyError(f"{source}: unknown key(s) {', '.join(unknown[:10])}",
                            f"allowed keys: {', '.join(KEYS)}")
    for key in ("gpu", "num_gpus"):
        if key not in raw:
            raise TopologyError(f"{source}: missing required key {key!r}",
                                "a cluster file needs at least `gpu:` and `num_gpus:`")
    values = {key: _checked(key, raw[key], source) for key in raw}
    gpu = _gpu_with_overrides(gpu_spec(values["gpu"]), values, source)

    merged: dict[str, Any] = {}
    network = read_yaml("network.yaml")
    for key, (section, entry) in _NETWORK_DEFAULTS.items():
        merged[key] = network[section][entry]
    systems = read_yaml("systems.yaml")
    merged.update(systems[gpu.name])       # per GPU generation: may override network.yaml's links
    nic = values.get("nic", merged["nic"])
    nic_kind = network["nics"].get(nic)
    if nic_kind is not None:
        merged["nic_bw"] = nic_kind["line_rate"]
        merged["nic_efficiency"] = nic_kind["efficiency"]
    elif not {"nic_bw", "nic_efficiency"} <= values.keys():
        raise TopologyError(f"{source}: unknown nic kind {nic!r}",
                            f"use one of: {', '.join(nic_kinds())}, or give nic_bw and nic_efficiency")
    merged.update(values)
    merged["gpu"] = gpu
    merged.setdefault("name", default_name)
    merged.setdefault("description", "")
    kwargs = {key: _coerce(key, merged[key]) for key in CLUSTER_KEYS}

    try:
        cluster = Cluster(**kwargs)
    except ValueError as err:  # Cluster.__post_init__ lists every layout problem
        raise TopologyError(f"{source}: {err}",
                            "fix the sizes in the cluster file (see the schema in the README)") from None
    if not cluster.description:
        cluster = dataclasses.replace(cluster, description=cluster.describe())
    return cluster


def _gpu_with_overrides(gpu: GPUSpec, values: dict[str, Any], source: str) -> GPUSpec:
    """The catalog spec with the cluster's ``gpu_*`` overrides applied (each must be > 0)."""
    changes: dict[str, Any] = {}
    for key, field in GPU_OVERRIDES.items():
        if key in values:
            if values[key] <= 0:
                raise TopologyError(f"{source}: {key} must be a positive number, got {values.pop(key)!r}",
                                    f"give the part's {field} or leave the key out for the {gpu.name} default")
            changes[field] = float(values.pop(key))
    return dataclasses.replace(gpu, **changes) if changes else gpu


def to_mapping(cluster: Cluster) -> dict[str, Any]:
    """Every key of the schema, explicit, in schema order (``gpu`` as its kind name); the
    ``gpu_*`` overrides only where the cluster's GPU differs from the catalog kind."""
    out = {}
    catalog = gpu_spec(cluster.gpu.name)
    for key in KEYS:
        if key in GPU_OVERRIDES:
            value = getattr(cluster.gpu, GPU_OVERRIDES[key])
            if value != getattr(catalog, GPU_OVERRIDES[key]):
                out[key] = value
            continue
        value = getattr(cluster, key)
        out[key] = value.name if key == "gpu" else value
    return out


def dump_yaml(cluster: Cluster) -> str:
    """The cluster as a complete cluster YAML file (reads back equal with ``from_mapping``)."""
    text: str = yaml.safe_dump(to_mapping(cluster), sort_keys=False, default_flow_style=False)   # Any untyped
    return text


def _checked(key: str, value: Any, source: str) -> Any:
    """The value with the type its key needs, or a TopologyError naming key and type."""
    if key in FLOAT_KEYS and isinstance(value, str):
        # PyYAML (YAML 1.1) reads "50e9" or "12.5e9" as strings: accept any float literal.
        try:
            value = float(value)
        except ValueError:
            pass
    if key in INT_KEYS:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_COUNT
        want = f"a positive integer (at most {MAX_COUNT:,})"
    elif key in FLOAT_KEYS:
        lo, hi, closed = RANGES[key]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and (lo <= value if closed else lo < value) and value <= hi)
        want = f"a finite number {'≥' if closed else '>'} {lo:g} and ≤ {hi:g}"
    elif key in BOOL_KEYS:
        ok = isinstance(value, bool)
        want = "true or false"
    else:
        ok = isinstance(value, str) and value != ""
        want = "a non-empty string"
    if not ok:
        raise TopologyError(f"{source}: {key} must be {want}, got {_SHORT.repr(value)}",
                            "see the cluster schema in the README")
    return value


def _coerce(key: str, value: Any) -> Any:
    if key in FLOAT_KEYS:
        return float(value)
    return value
