"""Pipeline-parallel schedules: explicit per-rank orders and an event simulator.

    from costmodels.pipeline import simulate, PipelineResult, SCHEDULES

``simulate`` prices one training step of a schedule from per-virtual-stage F/B/W times and
p2p times (schedules.py builds the orders, events.py compiles and runs them, steady.py
prices a long step from a short one, simulator.py is the entry point); ``simulate_many``
prices one shape under many sets of stage times at once, each as ``simulate`` would
(paired.py: a band's samples);
``closed_form_bubble``/``closed_form_peak_activations`` hold the papers' formulas the
simulator is tested against (closed_form.py).
"""
from costmodels.pipeline.closed_form import ClosedFormBubble, closed_form_bubble, closed_form_peak_activations
from costmodels.pipeline.schedules import (
    SCHEDULES,
    SPLIT_BACKWARD,
    V_SCHEDULES,
    ScheduleSpec,
    interleaved_group_size,
    stage_rank,
)
from costmodels.pipeline.simulator import PipelineResult, TimelineEntry, simulate, simulate_many

__all__ = ["ClosedFormBubble", "PipelineResult", "SCHEDULES", "SPLIT_BACKWARD", "ScheduleSpec", "TimelineEntry",
           "V_SCHEDULES",
           "closed_form_bubble", "closed_form_peak_activations", "interleaved_group_size",
           "simulate", "simulate_many", "stage_rank"]
