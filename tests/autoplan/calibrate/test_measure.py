"""autoplan/calibrate/measure.py on CPU: the timing loop and the kernels run end to end.

CUDA events and the GPU kernels themselves can only run on a GPU (``autoplan calibrate --quick``);
here the same code times tiny shapes with ``time.perf_counter``.
"""
import statistics

import pytest

from autoplan.calibrate.measure import TimingPolicy, measure, seconds_per_call
from autoplan.calibrate.plan import TINY_KERNELS, AttentionShape, GemmShape, MeasurementPlan

FAST = TimingPolicy(warmup=1, trials=3, min_trial_s=0.0, max_calls=2, spin_up_s=0.0)


class FakeClock:
    """Every call 'takes' the next of ``per_call`` seconds; records how calls were grouped."""

    def __init__(self, per_call):
        self.per_call, self.rows = list(per_call), []

    def sync(self):
        pass

    def seconds(self, fn, calls):
        self.rows.append(calls)
        t = self.per_call.pop(0)
        for _ in range(calls):
            fn()
        return t * calls


def test_seconds_per_call_sizes_rows_and_takes_the_median():
    calls = []
    clock = FakeClock([1e-5, 2e-5, 1e-5, 9e-5])
    policy = TimingPolicy(warmup=2, trials=3, min_trial_s=1e-3, max_calls=1000)
    t = seconds_per_call(lambda: calls.append(1), clock, policy)
    assert clock.rows == [1, 100, 100, 100]        # one probe call, then rows of 1 ms / 10 us
    assert t == statistics.median([2e-5, 1e-5, 9e-5]) and len(calls) == 2 + 1 + 300


def test_seconds_per_call_caps_the_row_length():
    clock = FakeClock([1e-9, 1e-9, 1e-9, 1e-9])
    seconds_per_call(lambda: None, clock, TimingPolicy(warmup=0, trials=3, min_trial_s=1.0, max_calls=50))
    assert clock.rows == [1, 50, 50, 50]


def test_measure_on_cpu_times_every_kernel_of_the_plan():
    plan = MeasurementPlan(gemms=(GemmShape(64, 32, 16), GemmShape(32, 64, 128)),
                           attention=(AttentionShape(2, 2, 64, 32, True), AttentionShape(1, 2, 128, 32, False)),
                           copy_bytes=(4096,), tiny_kernels=TINY_KERNELS)
    steps = []
    m = measure(plan, device="cpu", policy=FAST, on_step=lambda done, total, label: steps.append((done, total)))
    assert [(s.m, s.n, s.k) for s in m.gemm] == [(64, 32, 16), (32, 64, 128)]
    assert [(s.direction, s.batch, s.seq, s.causal) for s in m.attention] == \
        [("fwd", 2, 64, True), ("bwd", 2, 64, True), ("fwd", 1, 128, False), ("bwd", 1, 128, False)]
    assert [c.nbytes for c in m.copy] == [4096] and [t.kernel for t in m.tiny] == list(TINY_KERNELS)
    every = (*m.gemm, *m.attention, *m.copy, *m.tiny)
    assert all(0 < s.seconds < 1 for s in every)
    assert steps == [(i, len(every)) for i in range(1, len(every) + 1)]
    assert (m.device, m.attention_kernel) == ("cpu", "flash")
    assert m.software.startswith("torch ") and "perf_counter" in m.timing


def test_unknown_tiny_kernel_is_rejected():
    plan = MeasurementPlan(gemms=(), attention=(), copy_bytes=(), tiny_kernels=("nop",))
    with pytest.raises(ValueError, match="unknown tiny kernel 'nop'"):
        measure(plan, device="cpu", policy=FAST)
