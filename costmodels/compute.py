"""Compute time of one op on one GPU: a roofline with fitted efficiency curves.

For an op with ``flops`` FLOPs that moves ``nbytes`` bytes through HBM::

    t = max(flops / (peak · eff_compute), nbytes · fusion / (hbm_bw · eff_memory)) + overhead

* GEMMs (M, N, K): ``eff_compute = gemm_peak_fraction · Π_d d / (d + gemm_half_dim)`` over the
  three dims: large GEMMs approach ``gemm_peak_fraction`` of peak, a skinny dim
  (a 128-wide head, a tiny per-expert batch) costs efficiency, smoothly.
* FP8 GEMMs (``gemm_fp8``: a linear layer's GEMM under an FP8 plan, ``costmodels.precision``):
  the same curve against the FP8 peak (``GPUSpec.fp8_flops``, which the caller passes), its
  large-GEMM fraction ``fp8_gemm_peak_fraction`` where the profile sets one.
* Casts to FP8 (``cast``): memory bound, their bytes as given (no fusion: the scaling kernel
  is its own launch); so is any other kernel priced on its own bytes (ring attention's merges,
  ``autoplan.cost.cp``; a fused cross entropy, ``autoplan.cost.loss``).
* Attention kernels (flash/efficient attention): ``attention_fwd_fraction`` /
  ``attention_bwd_fraction`` of peak.
* Everything else is memory bound; ``fusion`` is the fraction of the unfused ATen
  graph's elementwise HBM traffic that remains once a training stack fuses
  bias/activation/dropout/residual kernels (Megatron, torch.compile).
* ``overhead_s`` is a per-kernel launch/tail cost on the GPU.
* ``host_floor_s`` is the CPU side of one eager op (Python, the dispatcher, autograd, the
  launch call): the host issues kernels (and collectives) no faster than one per
  ``host_floor_s``.  The GPU runs them asynchronously, so the host and the GPU are two stages
  of one pipeline: a long GEMM lets the host run ahead over the short kernels after it.  Over
  a phase of N launches (a layer's forward, or its backward) the steady state is::

      t_phase = max(Σ t_gpu (+ its exposed collectives), N · host_floor_s)

  (``autoplan.cost.parts``; ``op_time`` is the GPU side only).  It is what keeps a small
  transformer layer from getting faster than ~3 ms per micro-batch on vTrain's
  Megatron-DeepSpeed A100 runs, whatever its micro-batch or tp (fitted there:
  ``experiments/fit_host_floor.py``).

An MoE layer synchronizes the host with the GPU at every dispatch (its row counts size the
all-to-all and the grouped GEMM), so the host has no lead to absorb its launches: each phase of
an MoE layer lasts max(GPU, launches × ``moe_host_floor_s``), the launches being the engine's
(one GEMM per local expert, ``autoplan.cost.ep.engine_launches``), whatever ``host_floor_s``
says of dense layers; each MoE layer's forward dispatch leaves the GPU idle ``moe_sync_s`` while
the host, released by the sync, takes its turn; and the pipeline engine's host time per send or
receive, which a dense model's run-ahead hides, shows (``moe_p2p_host_s``, the ``p2p_host_s`` of
a model with experts).

A profile also names what its software stack runs beyond the traced graph (defaults: nothing):
``softmax_kernel: megatron`` (Megatron's fused scale-mask-softmax and its fp32 fallback,
``autoplan.cost.softmax``) and ``p2p_host_s``, the host seconds of one pipeline send or
receive instruction of the stack's pipeline engine (DeepSpeed's PipelineEngine,
``autoplan.cost.pp.engine_instructions``).

Profiles are YAML data files in ``costmodels/profiles/<gpu>.yaml`` (or any path
given with ``--profile``); ``autoplan calibrate`` writes new ones from measurements.
All times are seconds, FLOPs are FLOPs (multiply-add = 2), bytes are bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from costmodels.memo import memo
from topologies.strict_load import load_yaml

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")

# GPU kinds that share a profile (same silicon, same software efficiency).
_PROFILE_ALIASES = {"a100-40gb": "a100", "a100-80gb": "a100", "h800": "h100", "h200": "h100",
                    "gb200": "b200", "b300": "b200", "gb300": "b200"}


@dataclass(frozen=True)
class ComputeProfile:
    """Fitted efficiency parameters of one GPU kind (dimensionless fractions unless noted)."""

    name: str
    gemm_peak_fraction: float        # achieved / peak for large GEMMs
    gemm_half_dim: float             # a GEMM dim of this size halves its efficiency factor
    attention_fwd_fraction: float    # flash-attention forward, fraction of peak
    attention_bwd_fraction: float    # flash-attention backward, fraction of peak
    memory_fraction: float           # achieved / peak HBM bandwidth for streaming kernels
    fusion: float                    # fraction of unfused elementwise traffic that remains
    overhead_s: float                # per-kernel launch + tail, seconds
    host_floor_s: float = 0.0        # CPU seconds to issue one op (eager dispatch + launch)
    moe_host_floor_s: float = 0.0    # the same for an MoE layer, which synchronizes host and GPU at each
                                     # dispatch, so the host cannot run ahead of it (autoplan.cost.ep)
    moe_sync_s: float = 0.0          # GPU idle at each MoE layer's forward dispatch while the host takes its turn
    moe_p2p_host_s: float = 0.0      # p2p_host_s of an MoE model: its pipeline engine's host time is exposed
    softmax_kernel: str = ""         # "megatron": the stack runs Megatron's fused scale-mask-softmax
                                     # and its fp32 fallback where the kernel lacks the shape
                                     # (autoplan.cost.softmax); "": the traced graph's softmax
    fp8_gemm_peak_fraction: float = 0.0   # achieved / FP8 peak for large FP8 GEMMs; 0: gemm_peak_fraction
    p2p_host_s: float = 0.0          # host seconds per pipeline send/receive instruction of the stack's
                                     # pipeline engine (DeepSpeed's PipelineEngine; autoplan.cost.pp)
    source: str = ""                 # where the numbers come from

    def gemm_efficiency(self, m: float, n: float, k: float, fp8: bool = False) -> float:
        """Fraction of peak (the FP8 peak when ``fp8``) a (M, N, K) GEMM reaches."""
        eff = self.fp8_gemm_peak_fraction if fp8 and self.fp8_gemm_peak_fraction else self.gemm_peak_fraction
        for d in (m, n, k):
            eff *= d / (d + self.gemm_half_dim)
        return eff


def load_profile(gpu: str, path: str | None = None) -> ComputeProfile:
    """Load the profile for GPU kind ``gpu`` (e.g. "h100"), or the YAML file at ``path``."""
    if path is None:
        base = gpu.lower()
        name = _PROFILE_ALIASES.get(base, base)
        path = os.path.join(PROFILE_DIR, f"{name}.yaml")
        if not os.path.exists(path):
            known = sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".yaml"))
            raise ValueError(f"no compute profile for GPU '{gpu}' (known: {', '.join(known)})")
    return _load_profile_file(os.path.abspath(path))


@memo(64)
def _load_profile_file(path: str) -> ComputeProfile:
    with open(path) as f:
        data = load_yaml(f.read())
    allowed = {f.name for f in fields(ComputeProfile)}
    unknown = set(data) - allowed - {"gpu", "measurements", "uncertainty"}
    if unknown:
        raise ValueError(f"compute profile {path}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
    data = {k: v for k, v in data.items() if k in allowed}
    data.setdefault("name", os.path.basename(path)[:-5])
    return ComputeProfile(**data)


def op_time(kind: str, flops: float, nbytes: float, *, peak_flops: float, hbm_bw: float,
            profile: ComputeProfile, gemm: tuple[float, float, float] | None = None) -> float:
    """GPU seconds for one op on one GPU (the host's launch floor is applied per phase, above).

    ``kind``: "gemm" or "gemm_fp8" (needs ``gemm`` = local (M, N, K); ``peak_flops`` the
    precision's peak), "attention_fwd", "attention_bwd", "cast" (a bf16 → FP8 scaling kernel),
    or "memory" (elementwise, norms, reductions, copies).
    ``flops`` and ``nbytes`` are the op's local (per-GPU) FLOPs and HBM bytes.
    """
    if kind in ("gemm", "gemm_fp8") and gemm is not None:
        t_compute = flops / (peak_flops * profile.gemm_efficiency(*gemm, fp8=kind == "gemm_fp8"))
        t_memory = nbytes / (hbm_bw * profile.memory_fraction)
    elif kind in ("attention_fwd", "attention_bwd"):
        frac = profile.attention_fwd_fraction if kind == "attention_fwd" else profile.attention_bwd_fraction
        t_compute = flops / (peak_flops * frac)
        t_memory = nbytes / (hbm_bw * profile.memory_fraction)
    elif kind == "cast":
        t_compute, t_memory = 0.0, nbytes / (hbm_bw * profile.memory_fraction)
    else:
        t_compute = flops / (peak_flops * profile.gemm_peak_fraction)
        t_memory = nbytes * profile.fusion / (hbm_bw * profile.memory_fraction)
    return max(t_compute, t_memory) + profile.overhead_s
