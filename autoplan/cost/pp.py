"""Pipeline parallelism: layers to virtual stages, stage times, stage-to-stage P2P, the schedule's makespan.

Each virtual stage (chunk) is a *bag* of (per-micro-batch part, how many layers of it): its
layers by block kind, plus the embedding (``@pre``) on the first chunk and the head and loss
(``@post``) on the last.  Its forward time F = Σ (forward + exposed forward communication),
B = Σ (input-gradient + exposed backward communication), W = Σ weight-gradient.  These go to
the event simulator of ``costmodels.pipeline`` with the P2P time of one boundary activation,
``b·(s/cp)·h·2 / (tp if SP)`` bytes (bf16; sequence-sharded under SP).  DualPipeV overlaps one
micro-batch's EP all-to-all with the other's compute (DeepSeek-V3 §3.2.1), so the EP part of
each stage's time is passed to the simulator separately; TP/CP collectives stay on each
layer's critical path.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from autoplan.axes import Axis
from autoplan.cost.comms import Comms
from autoplan.cost.types import Part
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS

ACTIVATION_BYTES = 2                    # bf16
Bag = list[tuple[Part, int]]


@dataclass(frozen=True)
class Pipeline:
    """The priced pipeline of one plan."""

    bags: tuple[Bag, ...]                 # per virtual stage, model order
    rank_chunks: tuple[tuple[int, ...], ...]   # virtual stages of each pipeline rank
    f: tuple[float, ...]
    b: tuple[float, ...]
    w: tuple[float, ...]
    act_bytes: float                      # one boundary activation, bytes
    p2p_s: float                          # one stage-to-stage send, seconds
    sim: object                           # costmodels.pipeline simulation result
    p2p_exposed_s: float                  # what P2P adds to the makespan (0 unless detail)

    @property
    def step_s(self) -> float:
        return self.sim.step_time


def stage_bags(plan: Plan, order: tuple[str, ...], num_layers: int, part: Callable[[str, str], Part]) -> list[Bag]:
    """Each virtual stage as a bag of (part, layers of it); ``part(kind, recompute)``."""
    chunks = plan.pp * plan.vpp
    bags, start = [], 0
    for c, n in enumerate(plan.stage_layers(num_layers)):
        rc = plan.recompute_of_stage(plan.stage_rank(c))
        bag = [(part(k, rc), count) for k, count in Counter(order[start:start + n]).items()]
        start += n
        if c == 0:
            bag.append((part("@pre", "none"), 1))
        if c == chunks - 1:
            bag.append((part("@post", "none"), 1))
        bags.append(bag)
    return bags


def price_pipeline(comms: Comms, plan: Plan, mesh: Mesh, bags: list[Bag], m: int, seq_len: int, hidden: int,
                   *, detail: bool) -> Pipeline:
    f = [sum((p.forward_s + p.exposed_fwd_s) * n for p, n in bag) for bag in bags]
    b = [sum((p.backward_s + p.exposed_bwd_s) * n for p, n in bag) for bag in bags]
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    wpass = comms.params.wpass if SCHEDULE_SPECS[schedule].split_backward else 1.0   # a split W pass's cost
    w = [sum(p.wgrad_s * n for p, n in bag) * wpass for bag in bags]
    act_bytes = plan.mbs * seq_len / plan.cp * hidden * ACTIVATION_BYTES / (plan.tp if plan.sp else 1)
    pp_ranks = mesh.group(Axis.PP.value)
    p2p = comms.collective("p2p", act_bytes, pp_ranks[:2]) if plan.pp > 1 else 0.0
    f_comm = b_comm = None
    if schedule == "dualpipev":
        f_comm = [sum(p.ep_fwd_s * n for p, n in bag) for bag in bags]
        b_comm = [sum(p.ep_bwd_s * n for p, n in bag) for bag in bags]
    sim = comms.simulate(schedule, plan.pp, m, plan.vpp, f, b, w, p2p, f_comm, b_comm)
    p2p_exposed = 0.0
    if plan.pp > 1 and detail:
        no_p2p = comms.simulate(schedule, plan.pp, m, plan.vpp, f, b, w, 0.0, f_comm, b_comm)
        p2p_exposed = max(0.0, sim.step_time - no_p2p.step_time)
    rank_chunks = tuple(plan.stages_of_rank(r) for r in range(plan.pp))
    return Pipeline(tuple(bags), rank_chunks, tuple(f), tuple(b), tuple(w), act_bytes, p2p, sim, p2p_exposed)
