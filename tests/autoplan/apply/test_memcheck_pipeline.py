"""memcheck at pp > 1 (``autoplan/apply/memcheck_pipeline.py``): torch's per-rank order, the
tracker that allows micro-batches in flight, and a pipeline rank's step on fake tensors."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.apply.memcheck_pipeline import (
    dtensor_metadata_outside,
    peak_in_flight,
    step_tracker,
    torch_order,
    torch_stages,
)
from costmodels.pipeline.live import peak_live


@pytest.fixture
def fake_world():
    """A fake process group of 4 ranks, this process rank 0 (no traffic: orders only)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield 4
    dist.destroy_process_group()


def _schedule(p: int, v: int, m: int):
    stages = [PipelineStage(nn.Linear(2, 2), s, p * v, torch.device("cpu")) for s in range(0, p * v, p)]
    if v == 1:
        return Schedule1F1B(stages[0], n_microbatches=m, loss_fn=lambda out, target: out.sum())
    return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=lambda out, target: out.sum())


@pytest.mark.parametrize("v, m", [(1, 8), (2, 8), (2, 12), (3, 8)])
def test_torch_orders_hold_as_many_chunk_microbatches_as_the_simulator_prices(fake_world, v, m):
    """The live-activation count of costmodels/pipeline/live.py (every chunk weighing 1) is the
    most forwards in flight of torch's own per-rank order, rank by rank."""
    p = fake_world
    sched = _schedule(p, v, m)
    torch_counts = [peak_in_flight(torch_order(sched, r)) for r in range(p)]
    simulated = [int(x.bytes) for x in peak_live("interleaved" if v > 1 else "1f1b", p, m, v, [1.0] * (p * v))]
    assert torch_counts == simulated
    assert torch_counts[0] > torch_counts[-1] >= 1
    assert sorted(torch_stages(sched)) == list(range(0, p * v, p))
    compute = [k for k, _, _ in torch_order(sched, 0) if k != "REDUCE_GRAD"]
    assert compute.count("F") == compute.count("B") == m * v


@pytest.mark.parametrize("m", [4, 8])
def test_zbv_holds_the_chunk_microbatches_the_simulator_prices(fake_world, m):
    """torch's ScheduleZBVZeroBubble (V placement: stages r and 2p − 1 − r on rank r; split
    backward): its order has F, I and W actions, and the forwards alive until their W are the
    simulator's zbv count, rank by rank."""
    from torch.distributed.pipelining import ScheduleZBVZeroBubble

    p = fake_world
    stages = [PipelineStage(nn.Linear(2, 2), s, 2 * p, torch.device("cpu")) for s in (0, 2 * p - 1)]
    sched = ScheduleZBVZeroBubble(stages, n_microbatches=m, loss_fn=lambda out, target: out.sum())
    kinds = {k for k, _, _ in torch_order(sched, 0)}
    assert {"F", "I", "W"} <= kinds
    torch_counts = [peak_in_flight(torch_order(sched, r)) for r in range(p)]
    simulated = [int(x.bytes) for x in peak_live("zbv", p, m, 2, [1.0] * (2 * p))]
    assert torch_counts == simulated


def test_peak_in_flight_counts_forwards_not_yet_backwarded():
    order = [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("F", 0, 2), ("F", 0, 3), ("B", 0, 1)]
    assert peak_in_flight(order) == 3


def test_the_step_tracker_allows_a_second_forward_before_the_first_backward():
    """torch's MemTracker refuses a root module's second forward; the step tracker keeps the
    first's stats and still tracks every allocation: two micro-batches in flight hold twice
    one's saved bytes."""
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    x = torch.randn(64, 256)
    with pytest.raises(NotImplementedError, match="multiple iterative calls"):
        from torch.distributed._tools.mem_tracker import MemTracker
        with MemTracker():
            model(x)
            model(x)
    peaks = []
    for n in (1, 2):
        tracker = step_tracker()
        tracker.track_external(model)
        with tracker:
            outs = [model(x) for _ in range(n)]
            for out in outs:
                out.sum().backward()
        peaks.append(max(tracker.get_tracker_snapshot("peak").values(), key=lambda d: d["Total"])["Total"])
    saved_per_microbatch = 3 * 64 * 256 * 4           # two linear outputs and the relu output (fp32)
    assert peaks[1] - peaks[0] >= saved_per_microbatch * 0.99


def _split_backward_totals(tracker) -> list[int]:
    """The tracker's current bytes after each of four micro-batches' F, I and W (torch's
    ``stage_backward_input`` / ``stage_backward_weight``) of a stage with GELU and dropout, whose
    saved tensors W does not read."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 256), nn.GELU(),
                          nn.Linear(256, 256))
    tracker.track_external(model)
    totals = []
    with tracker:
        for _ in range(4):
            x = torch.randn(64, 256, requires_grad=True)
            out = model(x.view_as(x))
            _, groups = stage_backward_input([out.sum()], None, [x], model.parameters())
            stage_backward_weight(model.parameters(), groups)
            del x, out, groups
            totals.append(max(tracker.get_tracker_snapshot("current").values(), key=lambda d: d["Total"])["Total"])
    return totals


def test_the_step_tracker_frees_a_split_backward_at_its_weight_half():
    """torch's ModTracker hooks every forward's inputs and outputs with multi-grad hooks that hold
    their autograd nodes, so after W the saved tensors W does not read stay alive, a micro-batch at
    a time (torch 2.13); the step tracker's module tracker registers none: after each micro-batch
    the stage holds what it held after the first (its gradients)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class TorchsModuleTracker(MemTracker):            # the step tracker's one change, torch's hooks kept
        def _pre_fw_hook(self, module, inputs):
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                return
            super()._pre_fw_hook(module, inputs)

    ours = _split_backward_totals(step_tracker())
    assert ours == [ours[0]] * 4
    torchs = _split_backward_totals(TorchsModuleTracker())
    saved_gelu_input = 64 * 1024 * 4
    assert torchs[3] - torchs[0] >= 3 * saved_gelu_input        # a GELU input (and more) per micro-batch


def test_dtensor_metadata_stays_out_of_the_tracked_fake_mode(fake_world):
    """The vocabulary-parallel loss backward on fake tensors, tracked inside the fake mode: DTensor's
    global-shape metadata ops count (whole-vocabulary buffers) unless they get their own mode;
    with it, the loss holds 3 fp32 buffers of the local logits (memory.VOCAB_PARALLEL_LOSS_GRAD_BYTES)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from autoplan.apply.parallel import vocab_parallel_cross_entropy
    from autoplan.cost.memory import VOCAB_PARALLEL_LOSS_GRAD_BYTES
    from autoplan.frontend.fakes import new_fake_mode

    tp, seq, vocab = fake_world, 512, 4096
    mesh = init_device_mesh("cpu", (tp,))
    loss_fn, mode = vocab_parallel_cross_entropy(mesh, vocab), new_fake_mode()
    temp = {}
    for outside in (False, True):
        with mode:
            logits = torch.empty(1, seq, vocab // tp, dtype=torch.bfloat16, requires_grad=True)
            target = torch.zeros(1, seq, dtype=torch.long)
            tracker = MemTracker()
            with dtensor_metadata_outside(mode) if outside else contextlib.nullcontext(), tracker, loss_parallel():
                loss_fn(logits, target).backward()
        peak = max(tracker.get_tracker_snapshot("peak").values(), key=lambda d: d["Total"])
        temp[outside] = next(v for k, v in peak.items() if getattr(k, "value", k) == "Temp")
    assert temp[True] == pytest.approx(seq * vocab // tp * VOCAB_PARALLEL_LOSS_GRAD_BYTES, rel=0.01)
    assert temp[False] > 2 * temp[True]
