"""One pipeline rank's training step run locally, in the order torch's schedule runs it, for
``autoplan memcheck`` at pp > 1 (no point-to-point traffic).

torch's pipelining runtime cannot run under the fake process group (``autoplan.apply.memcheck``
says why), and needs no peer to decide what one rank holds: its memory is set by its own
stages, its own order of forwards and backwards and what each keeps.  So the step of one
pipeline rank is run from the schedule ``apply`` built (torch's class for the plan's
schedule) as follows:

* the order is the schedule's own per-rank action list (``schedule.pipeline_order[r]``:
  ``F`` forward, ``B`` full backward, ``I`` / ``W`` the input / weight half of a split one, of
  (stage, micro-batch); ``torch_order``);
* ``F`` of a stage that receives its input: a fresh tensor of the residual stream's local shape
  (``[mbs, s/tp, h]`` under sp, else ``[mbs, s, h]``) in the compute dtype, requiring grad —
  what the receive buffer holds; the first stage reads token ids.  The last stage's output goes
  through the plan's loss (``loss_fn(logits, targets)``), as the schedule's ``_compute_loss``;
* ``B`` of the stage's oldest forward not yet backwarded (every schedule run here takes a stage's
  backwards in its forwards' order; torch 2.13's ``Schedule1F1B.pipeline_order`` numbers the last
  rank's forwards one ahead, ``1F1, 1B0, 1F2, 1B1, …``, so its micro-batch indices are not used):
  ``PipelineStage.backward_maybe_with_nosync`` (torch's own: FSDP's no-sync, no
  reshard) with the loss, or with a fresh output gradient shaped as the stage's output (what
  the next rank sends); the stage input and its gradient are dropped afterwards (sent);
* ``I`` and ``W`` as torch's ``backward_one_chunk(full_backward=False)`` and
  ``backward_weight_one_chunk``: ``backward_maybe_with_nosync("input")`` keeps the graph and the
  gradients flowing into the weight ops (``param_groups``) for ``"weight"``; the first stage's
  ``I`` does nothing and its ``W`` is the full backward (``_backward``, ``_weight_backward``).
  From ``I`` to ``W`` a chunk keeps the graph below its weight ops (``retain_graph=True``; what
  lies above them, the loss, goes when the stage output is detached) and the gradient flowing
  into every weight op (``param_groups[i]["grads"]``: one output-sized tensor per linear and
  norm) — what the estimate prices (``ir.OpGraph.wgrad_held_outputs``,
  ``freed_at_input_grad_nodes``).  The tracker's module tracker registers no backward hooks
  (``forward_module_tracker``), which would keep those graphs alive past ``W``;
* ``REDUCE_GRAD`` (listed by single-stage schedules), and after the last backward for every
  stage without one (multi-stage schedules add it when lowered, after the stage's last
  backward): ``PipelineStage.perform_reduce_grad(m)``, FSDP's reduce-scatter and the gradient
  scaling by 1/m.

What torch's runtime holds besides and this run does not: the per-micro-batch receive buffers it
allocates up front for the whole step (``_prepare_forward_infra``: m activation and m gradient
buffers per stage, kept with their ``.grad`` until the next step's ``clear_runtime_states``).
Megatron-Core allocates a receive buffer per communication and frees it with its micro-batch,
which is what this run does.
"""
from __future__ import annotations

import collections
import contextlib

import torch

FORWARD, BACKWARD, REDUCE = "F", "B", "REDUCE_GRAD"
INPUT, WEIGHT = "I", "W"          # the split backward: input gradients, then weight gradients


@contextlib.contextmanager
def dtensor_metadata_outside(mode):
    """DTensor's sharding propagation runs each op once on fake tensors of the *global* shapes to
    learn its output metadata, under ``detect_fake_mode()`` when one is active (torch 2.13
    ``distributed/tensor/_sharding_prop.py``, ``_propagate_tensor_meta_non_cached``), else a fresh
    ``FakeTensorMode``.  Inside memcheck's own fake mode (``mode``, the one the tracker was entered
    in) those global tensors would count as this rank's memory: 16 × the local logits at a tp=8
    vocab-parallel loss.  In an eager run they are metadata; here they get a fresh mode, which the
    tracker skips as it skips every other propagation mode."""
    from torch.distributed.tensor import _sharding_prop

    detect = _sharding_prop.detect_fake_mode

    def other_than_mode(*args, **kwargs):
        found = detect(*args, **kwargs)
        return None if found is mode else found

    _sharding_prop.detect_fake_mode = other_than_mode
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = detect


def step_tracker():
    """torch's ``MemTracker`` for a step in which a module's forward runs again before its
    earlier backward (micro-batches in flight): a later forward of a module already seen keeps
    the stats of its first (``MemTracker._pre_fw_hook`` refuses a root module's second call, and
    ``reset_mod_stats`` between micro-batches loses the stats the pending backwards' hooks read).
    Its module tracker is ``forward_module_tracker()``'s.  Peaks and categories are unchanged:
    those come from its dispatch mode, not its module hooks."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):
        def __init__(self):
            super().__init__()
            self._mod_tracker = forward_module_tracker()

        def _pre_fw_hook(self, module, inputs):
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                return
            super()._pre_fw_hook(module, inputs)

    return StepTracker()


def forward_module_tracker():
    """torch's ``ModTracker`` without its backward hooks (private in torch 2.13: its
    ``_fw_pre_hook`` / ``_fw_post_hook`` less their ``register_multi_grad_hook`` calls).

    Each forward of a module registers a multi-grad hook on its inputs and outputs whose closure
    holds their autograd nodes (``torch.autograd.graph.register_multi_grad_hook``: ``grad_fns``).
    Under a split backward those nodes then outlive the micro-batch: ``W`` runs only the paths from
    the weight ops to the weights, so nodes it does not run (attention, GELU, dropout) keep their
    saved tensors for as long as a hook holds them — on the last rank of
    ``gpt:layers=8,hidden=1024`` ``pp=2,zb-h1`` 92 MiB more per micro-batch, 1.43 GiB at the peak
    against 0.90 GiB without these hooks, and without any tracker the same step holds what the
    latter does (``tests/autoplan/apply/test_memcheck_pipeline.py``).  What the hooks feed is
    per-module backward statistics, which memcheck does not read: the tracker's forward/backward
    split (activations vs temporaries) is the engine's graph-task id (``ModTracker.is_bw``), and its
    activation-checkpoint detection runs from the forward hooks kept here."""
    import weakref

    from torch.distributed._tools.mod_tracker import ModTracker

    class ForwardModTracker(ModTracker):
        def _fw_pre_hook(self, mod, input):
            self._get_append_fn(weakref.ref(mod), self._get_mod_name(mod), False)()
            if self._user_pre_fw_hook is not None:
                self._user_pre_fw_hook(mod, input)

        def _fw_post_hook(self, mod, input, output):
            if self._user_post_fw_hook is not None:
                self._user_post_fw_hook(mod, input, output)
            self._get_pop_fn(weakref.ref(mod), self._get_mod_name(mod), False)()

    return ForwardModTracker()


def torch_order(schedule, pp_rank: int) -> list[tuple[str, int, int | None]]:
    """(F | B | REDUCE_GRAD, virtual stage, micro-batch) of pipeline rank ``pp_rank``, in the
    order of ``schedule.pipeline_order`` (torch's per-rank compute actions, bubbles dropped;
    single-stage schedules list their gradient reduction, multi-stage ones add it when lowered)."""
    out = []
    for action in schedule.pipeline_order[pp_rank]:
        if action is None:
            continue
        kind = action.computation_type.value
        if kind not in (FORWARD, BACKWARD, INPUT, WEIGHT, REDUCE):
            raise ValueError(f"memcheck runs F, B, I, W and REDUCE_GRAD actions, not {kind} "
                             f"({type(schedule).__name__})")
        out.append((kind, action.stage_index, action.microbatch_index))
    return out


def torch_stages(schedule) -> dict:
    """Virtual stage index → the ``PipelineStage`` of this rank the schedule runs (private in
    torch 2.13: ``_stages`` of multi-stage schedules, ``_stage`` of single-stage ones)."""
    stages = schedule._stages if hasattr(schedule, "_stages") else [schedule._stage]
    return {s.stage_index: s for s in stages}


def peak_in_flight(order: list[tuple[str, int, int | None]]) -> int:
    """The most (stage, micro-batch) forwards whose backward has not run (full ``B``, or the
    weight half ``W`` of a split one: the graph is kept from ``I`` to ``W``), over ``order``."""
    alive = best = 0
    for kind, _, _ in order:
        alive += {FORWARD: 1, BACKWARD: -1, WEIGHT: -1}.get(kind, 0)
        best = max(best, alive)
    return best


def run_step(pm, pp_rank: int, ids: torch.Tensor, stream: tuple, dtype: torch.dtype) -> None:
    """One training step of pipeline rank ``pp_rank`` of ``pm`` (see the module docstring);
    ``ids``: one micro-batch of token ids [mbs, s] (also the targets); ``stream``: the local
    shape of the residual stream between stages; ``dtype``: its dtype."""
    m = pm.microbatches
    pipe_stages = torch_stages(pm.schedule)
    modules = {s.index: s for s in pm.stages}
    alive: dict[int, collections.deque] = collections.defaultdict(collections.deque)   # stage -> (input, output)
    split: dict[int, collections.deque] = collections.defaultdict(collections.deque)   # stage -> W's arguments
    with pm._context():
        reduced = set()
        for kind, sid, _ in torch_order(pm.schedule, pp_rank):
            stage, pipe = modules[sid], pipe_stages[sid]
            if kind == REDUCE:
                pipe.perform_reduce_grad(m)
                reduced.add(sid)
            elif kind == FORWARD:
                x = ids if stage.first else ids.new_empty(stream, dtype=dtype).requires_grad_()
                # a view into the stage: MemTracker's module hooks (multi-grad hooks) on a leaf
                # input fail under the split backward's autograd.grad
                out = stage(x if stage.first else x.view_as(x))
                alive[sid].append((x, pm.loss_fn(out, ids) if stage.last else out))
            elif kind == WEIGHT:
                _weight_backward(pipe, stage, *split[sid].popleft())
            else:                                 # a stage's backwards run in its forwards' order
                _backward(pipe, stage, *alive[sid].popleft(), split=split[sid] if kind == INPUT else None)
        for sid in sorted(set(pipe_stages) - reduced):
            pipe_stages[sid].perform_reduce_grad(m)
        pm._finish_gradients()


def _backward(pipe, stage, x, out, *, split: collections.deque | None) -> None:
    """A full backward (``split`` None) or the input half of a split one, whose weight half's
    arguments go to ``split`` — as torch's ``backward_one_chunk``: the first stage's input half
    does nothing and its weight half is the full backward; the loss bare to a full backward
    (a tuple with no gradients is skipped), in a tuple to the input half.  The stage input and
    its gradient are dropped afterwards (sent)."""
    grad = None if stage.last else torch.empty_like(out)
    kwargs = {"stage_output": out if grad is None else (out,), "output_grads": None if grad is None else (grad,),
              "input_values": () if stage.first else (x,)}
    if split is None:
        pipe.backward_maybe_with_nosync("full", kwargs)
    elif stage.first:
        split.append((kwargs, None))
    else:
        kwargs["stage_output"] = (out,)
        _, groups = pipe.backward_maybe_with_nosync("input", kwargs)
        split.append(({"stage_output": kwargs["stage_output"]}, groups))


def _weight_backward(pipe, stage, kwargs: dict, groups) -> None:
    """The weight half of a split backward (``_backward``); under Megatron's engine its gradients
    are folded into ``main_grad`` group by group as W computes them (``pm._context()`` enters
    ``distributed_optimizer.split_weight_gradients_folded``), as the runtime step does."""
    if stage.first:
        pipe.backward_maybe_with_nosync("full", kwargs)
    else:
        pipe.backward_maybe_with_nosync("weight", {**kwargs, "param_groups": groups})
