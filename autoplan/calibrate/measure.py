"""Time a ``MeasurementPlan`` with torch: seconds per call of every kernel, all bf16.

Timing (``TimingPolicy``): each kernel is called ``warmup`` times, then once alone to estimate
its time, then ``trials`` times in a row of ``calls`` back-to-back calls, ``calls`` chosen so a
row lasts at least ``min_trial_s`` (at most ``max_calls``).  The time is the median over the
rows of row seconds / calls.  On CUDA a row is bracketed by CUDA events after a synchronize, so
a backlog of earlier work cannot hide the launch gaps; on CPU (used by the tests) by
``time.perf_counter``.  Before anything is timed, an 8k GEMM runs for ``spin_up_s`` seconds so
clocks are up and cuBLAS is initialised.

Kernels, as a training step runs them:

* GEMM: ``torch.mm(a, w.t(), out=c)`` with ``a: [M, K]``, ``w: [N, K]`` (``F.linear``'s layout),
  operands cut as views from random buffers allocated once.
* attention: ``F.scaled_dot_product_attention`` under ``sdpa_kernel(FLASH_ATTENTION)`` (the
  memory-efficient kernel where flash does not run); the backward is
  ``torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)`` on one forward.
* copy: ``dst.copy_(src)``; tiny kernels: a 1k-element add, a 4 KiB copy, a 64x64x64 GEMM.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from autoplan.calibrate.plan import HEAD_DIM, AttentionShape, MeasurementPlan
from autoplan.errors import UserError
from costmodels.profile_fit import AttentionSample, CopySample, GemmSample, Measurements, TinySample

DTYPE = torch.bfloat16

# on_step(done, total, label): progress callback, called after each timed kernel.
StepCallback = Callable[[int, int, str], None]


@dataclass(frozen=True)
class TimingPolicy:
    """How each kernel is timed (see the module docstring)."""

    warmup: int = 3
    trials: int = 3
    min_trial_s: float = 0.01
    max_calls: int = 2000
    spin_up_s: float = 1.0

    def describe(self, clock: str) -> str:
        """One line for ``Measurements.timing``."""
        return (f"{clock}; per kernel {self.warmup} warm-up calls, then the median over {self.trials} "
                f"rows of back-to-back calls (each row >= {self.min_trial_s * 1e3:g} ms, "
                f"<= {self.max_calls} calls) of row time / calls")


class _Clock:
    """Seconds taken by ``calls`` back-to-back calls of ``fn`` (CUDA events, or perf_counter on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, fn: Callable[[], object], calls: int) -> float:
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return time.perf_counter() - start
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3


def seconds_per_call(fn: Callable[[], object], clock: _Clock, policy: TimingPolicy) -> float:
    """Median seconds per call of ``fn`` under ``policy``."""
    for _ in range(policy.warmup):
        fn()
    clock.sync()
    one = clock.seconds(fn, 1)
    calls = min(policy.max_calls, max(1, math.ceil(policy.min_trial_s / max(one, 1e-9))))
    return statistics.median(clock.seconds(fn, calls) / calls for _ in range(policy.trials))


def measure(plan: MeasurementPlan, *, device: str = "cuda", policy: TimingPolicy = TimingPolicy(),
            on_step: StepCallback | None = None) -> Measurements:
    """Time every kernel of ``plan`` on ``device`` ("cuda" = the current CUDA device; "cpu" for tests)."""
    dev = torch.device(device)
    clock = _Clock(dev)
    torch.manual_seed(0)
    total = len(plan.tiny_kernels) + len(plan.copy_bytes) + len(plan.gemms) + 2 * len(plan.attention)
    done = 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if on_step is not None:
            on_step(done, total, label)

    _spin_up(dev, clock, policy.spin_up_s)
    tiny = []
    for name in plan.tiny_kernels:
        tiny.append(TinySample(name, seconds_per_call(_tiny_kernel(name, dev), clock, policy)))
        step(f"tiny {name}")
    copies = []
    for nbytes in plan.copy_bytes:
        src = torch.full((nbytes // 2,), 1.0, dtype=DTYPE, device=dev)
        dst = torch.empty_like(src)
        # seconds_per_call runs the lambda before the loop moves on and ``del`` drops src and dst
        copies.append(CopySample(nbytes, seconds_per_call(lambda: dst.copy_(src), clock, policy)))  # noqa: B023, F821
        step(f"copy {nbytes // 2**20} MiB")
        del src, dst
    gemms = _measure_gemms(plan, dev, clock, policy, step)
    _release(dev)
    backend, backend_name = attention_backend(dev)
    attention = []
    with sdpa_kernel(backend):
        for shape in plan.attention:
            fwd_s, bwd_s = _time_attention(shape, dev, clock, policy)
            for direction, seconds in (("fwd", fwd_s), ("bwd", bwd_s)):
                attention.append(AttentionSample(direction, shape.batch, shape.heads, shape.seq,
                                                 shape.head_dim, shape.causal, seconds))
                step(f"attention {direction} b{shape.batch} a{shape.heads} s{shape.seq} "
                     f"{'causal' if shape.causal else 'full'}")
    _release(dev)
    return Measurements(
        device=torch.cuda.get_device_name() if clock.cuda else "cpu",
        software=f"torch {torch.__version__}, " + (f"CUDA {torch.version.cuda}" if clock.cuda else "CPU"),
        attention_kernel=backend_name,
        timing=policy.describe("CUDA events" if clock.cuda else "time.perf_counter"),
        gemm=tuple(gemms), attention=tuple(attention), copy=tuple(copies), tiny=tuple(tiny))


def attention_backend(dev: torch.device) -> tuple[SDPBackend, str]:
    """The fused SDPA kernel to time: flash if it runs here (forward and backward), else efficient."""
    q = torch.randn(1, 2, 256, HEAD_DIM, dtype=DTYPE, device=dev, requires_grad=True)
    for backend, name in ((SDPBackend.FLASH_ATTENTION, "flash"),
                          (SDPBackend.EFFICIENT_ATTENTION, "efficient")):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            return backend, name
        except RuntimeError:
            continue
    raise UserError(f"neither the flash nor the memory-efficient attention kernel runs on {dev}",
                    fix="autoplan calibrate needs a GPU with fused SDPA kernels (flash needs sm80+)")


def _measure_gemms(plan: MeasurementPlan, dev: torch.device, clock: _Clock, policy: TimingPolicy,
                   step: Callable[[str], None]) -> list[GemmSample]:
    """Time every GEMM of the plan, operands cut from three random buffers."""
    if not plan.gemms:
        return []
    a_buf = torch.randn(max(s.m * s.k for s in plan.gemms), dtype=DTYPE, device=dev)
    w_buf = torch.randn(max(s.n * s.k for s in plan.gemms), dtype=DTYPE, device=dev)
    c_buf = torch.empty(max(s.m * s.n for s in plan.gemms), dtype=DTYPE, device=dev)
    out = []
    for s in plan.gemms:
        a = a_buf[: s.m * s.k].view(s.m, s.k)
        w = w_buf[: s.n * s.k].view(s.n, s.k)
        c = c_buf[: s.m * s.n].view(s.m, s.n)
        out.append(GemmSample(s.m, s.n, s.k,
                              seconds_per_call(lambda: torch.mm(a, w.t(), out=c), clock, policy)))  # noqa: B023 - run here
        step(f"gemm {s.m}x{s.n}x{s.k}")
    return out


def _time_attention(shape: AttentionShape, dev: torch.device, clock: _Clock,
                    policy: TimingPolicy) -> tuple[float, float]:
    """(forward, backward) seconds per call of one attention shape, under the caller's backend."""
    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    q, k, v = (torch.randn(size, dtype=DTYPE, device=dev, requires_grad=True) for _ in range(3))

    def forward() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    fwd_s = seconds_per_call(forward, clock, policy)
    out = forward()
    grad_out = torch.randn_like(out)
    bwd_s = seconds_per_call(lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True),
                             clock, policy)
    return fwd_s, bwd_s


def _tiny_kernel(name: str, dev: torch.device) -> Callable[[], object]:
    """A kernel whose FLOPs and bytes are negligible: its time is launch + tail."""
    if name == "add_1k":
        x, y, z = (torch.randn(1024, dtype=DTYPE, device=dev) for _ in range(3))
        return lambda: torch.add(x, y, out=z)
    if name == "copy_4k":
        src, dst = (torch.randn(2048, dtype=DTYPE, device=dev) for _ in range(2))
        return lambda: dst.copy_(src)
    if name == "gemm_64":
        a, b, c = (torch.randn(64, 64, dtype=DTYPE, device=dev) for _ in range(3))
        return lambda: torch.mm(a, b, out=c)
    raise ValueError(f"unknown tiny kernel {name!r}")


def _spin_up(dev: torch.device, clock: _Clock, seconds: float) -> None:
    """Run 8k GEMMs for ``seconds`` so clocks are up and cuBLAS is initialised."""
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, dtype=DTYPE, device=dev)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            torch.mm(a, a)
        clock.sync()


def _release(dev: torch.device) -> None:
    """Give cached blocks back between groups of very different sizes."""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
