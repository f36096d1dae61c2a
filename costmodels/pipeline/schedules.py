"""Pipeline schedules as explicit per-rank orders of operations.

A schedule is a list, per pipeline rank, of *actions* in the order that rank runs them.  An
action is a tuple of one or two ops; two ops means an overlapped pair (DualPipeV's F&B),
which runs as one unit on its rank.  An op is ``(kind, microbatch, virtual_stage)``:

    F   forward of one micro-batch through one virtual stage
    B   input-gradient backward (dL/dx) — the part the previous stage waits for
    W   weight-gradient backward (dL/dW) — nobody waits for it, so it can fill bubbles
    BW  B and W run back to back as one op (schedules that do not split the backward)

Virtual stages are numbered 0 .. pp·chunks−1 in model order.  Two placements exist:

    looped  virtual stage s lives on rank s mod pp (chunk s // pp) — GPipe, 1F1B,
            Megatron interleaved, ZB-H1/H2
    v       rank r holds virtual stages r and 2·pp−1−r — ZB-V and DualPipeV, so the
            forward runs down the ranks and back up, and the last virtual stage (the
            loss) sits on rank 0 next to the first

Only the orders live here.  Timing (who waits for whom, p2p) is the simulator's job, so
unequal stage times and slow links need no special cases.  Every order is checked for
deadlock when it is compiled (costmodels.pipeline.simulator).

References (read to get the orders right; the code below is our own):
- GPipe: Huang et al., NeurIPS'19.  1F1B (PipeDream-flush): Narayanan et al., SC'21
  "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM".
- Megatron interleaved: megatron/core/pipeline_parallel/schedules.py,
  ``get_pp_rank_microbatches`` (warm-up count) and ``get_schedule_table`` (micro-batch
  groups of ``microbatch_group_size_per_vp_stage``, default pp).
- ZB-H1/ZB-H2/ZB-V: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24
  (arXiv 2401.10241) §2 and §6; PyTorch torch/distributed/pipelining/schedules.py
  (``ScheduleInterleavedZeroBubble`` with one chunk = ZB-H1, ``ScheduleZBVZeroBubble``).
- DualPipeV: DeepSeek-V3 technical report (arXiv 2412.19437) §3.2.1 and
  github.com/deepseek-ai/DualPipe; PyTorch ``ScheduleDualPipeV``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodels.memo import memo

F, B, W, BW = 0, 1, 2, 3
KIND_NAMES = ("F", "B", "W", "BW")

Op = tuple[int, int, int]          # (kind, microbatch, virtual_stage)
Action = tuple[Op, ...]            # one op, or an overlapped (F, BW) pair
RankOrder = list[Action]


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule needs and promises; the search reads this to enumerate candidates.

    ``min_chunks``/``max_chunks`` bound the chunks (virtual stages per rank) it accepts;
    ``split_backward`` says whether it runs B and W as separate ops (then ``w`` matters
    for its order, not just for the sum ``b + w``); ``min_microbatches(pp)`` is the
    smallest m it accepts.
    """

    name: str
    placement: str                 # "looped" or "v"
    min_chunks: int
    max_chunks: int | None
    split_backward: bool
    overlapped_pairs: bool
    min_microbatches: Callable[[int], int]
    reference: str

    def check(self, stages: int, microbatches: int, chunks: int) -> None:
        """Raise ValueError when (pp, m, chunks) is outside what this schedule supports."""
        if stages < 1 or microbatches < 1 or chunks < 1:
            raise ValueError(f"stages, microbatches and chunks must be >= 1, got "
                             f"{stages}, {microbatches}, {chunks}")
        if chunks < self.min_chunks or (self.max_chunks is not None and chunks > self.max_chunks):
            want = (f"exactly {self.min_chunks}" if self.min_chunks == self.max_chunks
                    else f">= {self.min_chunks}")
            hint = " (use '1f1b' for one chunk per rank)" if self.name == "interleaved" else ""
            raise ValueError(f"schedule {self.name!r} needs chunks {want}, got {chunks}{hint}")
        need = self.min_microbatches(stages)
        if microbatches < need:
            raise ValueError(f"schedule {self.name!r} needs at least {need} micro-batches "
                             f"for pp={stages}, got {microbatches}")


def stage_rank(stage: int, stages: int, placement: str) -> int:
    """Rank that holds virtual stage ``stage`` (see module docstring for placements)."""
    if placement == "looped":
        return stage % stages
    return stage if stage < stages else 2 * stages - 1 - stage


# ---------------------------------------------------------------------------------------
# Order generators: (pp, m, chunks) -> one RankOrder per rank.
# ---------------------------------------------------------------------------------------

def gpipe_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """All forwards, then all backwards (micro-batch order); peak m in flight per rank."""
    # ignore: mypy types each list as list[tuple[Op]] (one op) before the `+`, not as a RankOrder
    return [[((F, i, r),) for i in range(m)] + [((BW, i, r),) for i in range(m)]  # type: ignore[misc]
            for r in range(p)]


def one_f_one_b_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """PipeDream-flush 1F1B: rank r runs min(p−1−r, m) warm-up forwards, then alternates
    one forward and one backward, then drains the backwards.  Peak in flight p−r."""
    orders = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        acts: RankOrder = [((F, i, r),) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [((F, warmup + i, r),), ((BW, i, r),)]
        acts += [((BW, i, r),) for i in range(m - warmup, m)]
        orders.append(acts)
    return orders


def interleaved_group_size(p: int, m: int) -> int:
    """Micro-batches per group in Megatron's interleaved table: the smallest g >= pp whose
    last group is empty or holds >= pp micro-batches (Megatron raises otherwise; a
    shorter last group would leave a rank waiting on a forward it has not run yet).
    g = pp whenever pp divides m; g = m when m < pp (one group)."""
    if m <= p:
        return m
    return next(g for g in range(p, m + 1) if m % g == 0 or m % g >= p)


def interleaved_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """Megatron-LM interleaved 1F1B with v chunks per rank.

    Micro-batches go through a chunk in groups of g (``interleaved_group_size``: pp when pp
    divides m, Megatron's default ``microbatch_group_size_per_vp_stage``): the k-th forward
    of a rank is entry k of the table [(mb, chunk) for each group, for chunk in 0..v−1,
    for mb in group] (``get_schedule_table``); the k-th backward is entry k with the chunk
    reversed.  Warm-up forwards on rank r: min(2·(pp−r−1) + (v−1)·g, m·v)
    (``get_pp_rank_microbatches``), then 1F1B pairs, then the remaining backwards.  Peak
    in flight on rank r: warm-up + 1 chunks.
    """
    g = interleaved_group_size(p, m)
    table: list[tuple[int, int]] = []
    for lo in range(0, m, g):
        table += [(i, c) for c in range(v) for i in range(lo, min(lo + g, m))]
    total = m * v
    orders = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * g, total)

        def fwd(k: int, r: int = r) -> Action:   # r bound now: the closures run in this iteration only
            i, c = table[k]
            return ((F, i, c * p + r),)

        def bwd(k: int, r: int = r) -> Action:
            i, c = table[k]
            return ((BW, i, (v - 1 - c) * p + r),)

        acts: RankOrder = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            acts += [fwd(warmup + k), bwd(k)]
        acts += [bwd(k) for k in range(total - warmup, total)]
        orders.append(acts)
    return orders


def zb_h1_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """ZB-H1 (Qi et al. §2.1, Fig. 3 top): 1F1B's warm-up (p−1−r forwards), then each step
    runs F then B; rank r holds back its first r W's (W of the oldest pending
    micro-batch joins each step from step r on) and drains them at the end, where 1F1B
    would idle.  Counting a micro-batch in flight until its W, every rank peaks at p —
    1F1B's peak on rank 0.  Bubble (p−1)(F+B−W) vs 1F1B's (p−1)(F+B+W)."""
    orders = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        acts: RankOrder = [((F, i, r),) for i in range(warmup)]
        next_w = 0
        for j in range(m):
            if j < m - warmup:
                acts.append(((F, warmup + j, r),))
            acts.append(((B, j, r),))
            if j >= r:
                acts.append(((W, next_w, r),))
                next_w += 1
        acts += [((W, i, r),) for i in range(next_w, m)]
        orders.append(acts)
    return orders


def zb_h2_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """ZB-H2 (Qi et al. §2.2, Fig. 3 bottom): extra warm-up forwards fill the bubble before
    the first B, and W's fill the tail, so at F = B = W the step becomes a parallelogram
    with no idle time inside any rank's span, at up to 2p−1 micro-batches in flight.

    The paper gives ZB-H2 as a figure, not a formula, so the order here is the one a
    unit-time list scheduler produces under the paper's rules (its §3 heuristic with
    memory limit 2p−1): at each time step every free rank runs, in priority order,
    (1) a B whose input has arrived — B is on the critical path; (2) else an F whose
    input has arrived, if fewer than 2p−1 micro-batches are alive on the rank (counted
    until their W); (3) else the W of its oldest pending micro-batch.  That yields 2p−1
    warm-up forwards on rank 0 (2(p−1−r)+1 on rank r), a steady state of B, W, F, and a
    tail of W's; at F = B = W the steady bubble is 0 and every rank peaks at 2p−1.
    """
    cap = 2 * p - 1
    f_end = [[-1] * m for _ in range(p)]     # unit-time end of F(i) on rank r, -1 = not run
    b_end = [[-1] * m for _ in range(p)]
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    orders: list[RankOrder] = [[] for _ in range(p)]
    t = 0
    while any(x < m for x in nw):
        for r in range(p):
            i = nb[r]
            src = f_end[r] if r == p - 1 else b_end[r + 1]
            if i < nf[r] and 0 <= src[i] <= t:
                b_end[r][i] = t + 1
                nb[r] += 1
                orders[r].append(((B, i, r),))
                continue
            i = nf[r]
            if i < m and nf[r] - nw[r] < cap and (r == 0 or 0 <= f_end[r - 1][i] <= t):
                f_end[r][i] = t + 1
                nf[r] += 1
                orders[r].append(((F, i, r),))
                continue
            if nw[r] < nb[r]:
                orders[r].append(((W, nw[r], r),))
                nw[r] += 1
        t += 1
        if t > 4 * (m + p) * 3:
            raise RuntimeError("zb-h2 list scheduler made no progress (a bug)")
    return orders


def zbv_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """ZB-V (Qi et al. §6; PyTorch ``ScheduleZBVZeroBubble``): two chunks per rank in V
    placement, chunk 0 = virtual stage r, chunk 1 = virtual stage 2p−1−r.

    Rank r: 2(p−r)−1 forwards of chunk 0; r times (F chunk 1, F chunk 0); p−r steps of
    (F, B, W) on chunk 1; then steps of (F, B, W) on chunk 0 followed by (F, B, W) on
    chunk 1 until all forwards ran; cool-down: r times (B chunk 0, B chunk 1), p−r times
    (B chunk 0, W chunk 0), then the remaining W's of chunk 1 and chunk 0.  With m >= 2p−1
    every rank peaks at 2p chunks in flight (= p full stages, 1F1B's peak on rank 0).  The
    order is built for max(m, 2p−1) micro-batches and ops of micro-batches ≥ m are
    dropped, as PyTorch does, so any m works.
    """
    n = max(m, 2 * p - 1)
    return [_zbv_rank_order(p, m, n, r) for r in range(p)]


class _VRankOrder:
    """One rank's order under construction in V placement: chunk 0 = stage ``s0``, chunk 1 =
    stage ``s1``, with the next F, B and W micro-batch of each chunk.  Ops of micro-batches ≥ m
    are counted but not added (the order is built for more micro-batches than run)."""

    def __init__(self, m: int, s0: int, s1: int) -> None:
        self.m = m
        self.stage = (s0, s1)
        self.acts: RankOrder = []
        self.f = [0, 0]
        self.b = [0, 0]
        self.w = [0, 0]

    def _add(self, kind: int, mb: int, chunk: int) -> None:
        if mb < self.m:
            self.acts.append(((kind, mb, self.stage[chunk]),))

    def forward(self, chunk: int) -> None:
        self._add(F, self.f[chunk], chunk)
        self.f[chunk] += 1

    def backward(self, chunk: int) -> None:
        self._add(B, self.b[chunk], chunk)
        self.b[chunk] += 1

    def weight(self, chunk: int) -> None:
        self._add(W, self.w[chunk], chunk)
        self.w[chunk] += 1


def _zbv_rank_order(p: int, m: int, n: int, r: int) -> RankOrder:
    """Rank ``r``'s ZB-V order over ``n`` micro-batches (ops of those ≥ ``m`` dropped)."""
    o = _VRankOrder(m, r, 2 * p - 1 - r)
    for _ in range(2 * (p - r) - 1):
        o.forward(0)
    for _ in range(r):
        o.forward(1)
        o.forward(0)
    for _ in range(p - r):
        o.forward(1)
        o.backward(1)
        o.weight(1)
    while o.f[1] < o.f[0] or o.f[0] < n:
        if o.f[0] < n:
            o.forward(0)
        o.backward(0)
        o.weight(0)
        o.forward(1)
        o.backward(1)
        o.weight(1)
    for _ in range(r):                      # cool-down: W's held back, then drained
        o.backward(0)
        o.backward(1)
    for _ in range(p - r):
        o.backward(0)
        o.weight(0)
    while o.w[1] < o.b[1]:
        o.weight(1)
    while o.w[0] < o.b[0]:
        o.weight(0)
    return o.acts


def dualpipev_orders(p: int, m: int, v: int) -> list[RankOrder]:
    """DualPipeV (DeepSeek-V3 report §3.2.1; deepseek-ai/DualPipe ``DualPipeV``): two chunks
    per rank in V placement; the steady state runs *overlapped pairs* — the forward of
    one chunk together with the full backward of the other — so one micro-batch's
    all-to-all hides under the other's compute.

    Rank r, with chunk 0 = stage r and chunk 1 = stage 2p−1−r, in eight phases:
      1. 2(p−r−1) forwards of chunk 0
      2. r+1 times: forward chunk 0, forward chunk 1
      3. p−r−1 steps (B chunk 1, W of the oldest pending B, F chunk 1) — zero-bubble style
      4. m−2p+r+1 steps of two overlapped pairs: (F chunk 0 & BW chunk 1), then
         (F chunk 1 & BW chunk 0); on the last rank the very first pair runs as two plain
         ops (the forward feeds its own chunk 1 directly)
      5. p−r−1 steps (BW chunk 1, then pair F chunk 1 & BW chunk 0)
      6. r+1 steps (backward chunk 1, backward chunk 0); from the middle step on these
         are input-only B's whose W's are queued (odd ranks switch one op earlier)
      7. p−r−1 steps (W of the oldest pending B, backward chunk 0 — split if step 6 split)
      8. the remaining queued W's
    Needs m >= 2p.  Peak in flight 2p+1 chunks on every rank (the report's "PP+1" with PP =
    2p virtual stages), counting a pair's forward before its backward frees memory.
    """
    return [_dualpipev_rank_order(p, m, r) for r in range(p)]


class _DualPipeVRankOrder:
    """One rank's DualPipeV order under construction: chunk 0 = stage ``s0``, chunk 1 = stage
    ``s1``, the next micro-batch of each (forward | backward, stage), and the W's queued behind
    input-only B's (oldest first)."""

    def __init__(self, s0: int, s1: int) -> None:
        self.s0, self.s1 = s0, s1
        self.acts: RankOrder = []
        self.nxt = {(F, s0): 0, (F, s1): 0, (B, s0): 0, (B, s1): 0}
        self.pending_w: list[tuple[int, int]] = []

    def _take(self, kind: int, s: int) -> int:
        key = (F if kind == F else B, s)
        i = self.nxt[key]
        self.nxt[key] = i + 1
        return i

    def single(self, kind: int, s: int) -> None:
        """One op alone; an input-only B queues its W."""
        i = self._take(kind, s)
        self.acts.append(((kind, i, s),))
        if kind == B:
            self.pending_w.append((i, s))

    def pair(self, fs: int, bs: int) -> None:
        """An overlapped pair: the forward of stage ``fs`` with the full backward of stage ``bs``."""
        self.acts.append(((F, self._take(F, fs), fs), (BW, self._take(BW, bs), bs)))

    def pop_w(self) -> None:
        """The oldest queued W, if any."""
        if self.pending_w:
            i, s = self.pending_w.pop(0)
            self.acts.append(((W, i, s),))


def _dualpipev_rank_order(p: int, m: int, r: int) -> RankOrder:
    """Rank ``r``'s DualPipeV order: the eight phases of ``dualpipev_orders``."""
    o = _DualPipeVRankOrder(r, 2 * p - 1 - r)
    s0, s1 = o.s0, o.s1
    for _ in range(2 * (p - r - 1)):                 # 1
        o.single(F, s0)
    for _ in range(r + 1):                           # 2
        o.single(F, s0)
        o.single(F, s1)
    for _ in range(p - r - 1):                       # 3
        o.single(B, s1)
        o.pop_w()
        o.single(F, s1)
    for k in range(m - 2 * p + r + 1):               # 4
        if k == 0 and r == p - 1:
            o.single(F, s0)
            o.single(BW, s1)
        else:
            o.pair(s0, s1)
        o.pair(s1, s0)
    for _ in range(p - r - 1):                       # 5
        o.single(BW, s1)
        o.pair(s1, s0)
    _dualpipev_cooldown(o, p, r)
    return o.acts


def _dualpipev_cooldown(o: _DualPipeVRankOrder, p: int, r: int) -> None:
    """Phases 6-8: backwards of both chunks, input-only from the middle step on (odd ranks one
    op earlier), then W's interleaved with chunk 0's last backwards, then the queued W's."""
    split = False
    steps6 = r + 1
    for k in range(steps6):                          # 6
        if k == steps6 // 2 and r % 2 == 1:
            split = True
        o.single(B if split else BW, o.s1)
        if k == steps6 // 2 and r % 2 == 0:
            split = True
        o.single(B if split else BW, o.s0)
    for _ in range(p - r - 1):                       # 7
        o.pop_w()
        o.single(B if split else BW, o.s0)
    for _ in range(r + 1):                           # 8
        o.pop_w()
    while o.pending_w:
        o.pop_w()


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------

_GENERATORS: dict[str, Callable[[int, int, int], list[RankOrder]]] = {
    "gpipe": gpipe_orders,
    "1f1b": one_f_one_b_orders,
    "interleaved": interleaved_orders,
    "zb-h1": zb_h1_orders,
    "zb-h2": zb_h2_orders,
    "zbv": zbv_orders,
    "dualpipev": dualpipev_orders,
}


def _any_m(p: int) -> int:
    return 1


# The one registry of schedules, in the order plans list them and the search tries them; the
# V placements, the split-backward (zero-bubble) set and the plan grammar are read off it.
SCHEDULES: dict[str, ScheduleSpec] = {
    "gpipe": ScheduleSpec("gpipe", "looped", 1, 1, False, False, _any_m,
                          "Huang et al. NeurIPS'19"),
    "1f1b": ScheduleSpec("1f1b", "looped", 1, 1, False, False, _any_m,
                         "Narayanan et al. SC'21 (PipeDream-flush)"),
    "interleaved": ScheduleSpec("interleaved", "looped", 2, None, False, False, _any_m,
                                "Narayanan et al. SC'21 §2.2; Megatron-LM schedules.py"),
    "zb-h1": ScheduleSpec("zb-h1", "looped", 1, 1, True, False, _any_m,
                          "Qi et al. ICLR'24 §2.1"),
    "zb-h2": ScheduleSpec("zb-h2", "looped", 1, 1, True, False, _any_m,
                          "Qi et al. ICLR'24 §2.2"),
    "zbv": ScheduleSpec("zbv", "v", 2, 2, True, False, _any_m,
                        "Qi et al. arXiv 2401.10241 §6 (ZB-V)"),
    "dualpipev": ScheduleSpec("dualpipev", "v", 2, 2, True, True, lambda p: 2 * p,
                              "DeepSeek-V3 report §3.2.1; deepseek-ai/DualPipe"),
}


V_SCHEDULES: tuple[str, ...] = tuple(n for n, spec in SCHEDULES.items() if spec.placement == "v")
SPLIT_BACKWARD: tuple[str, ...] = tuple(n for n, spec in SCHEDULES.items() if spec.split_backward)


def build_orders(schedule: str, stages: int, microbatches: int, chunks: int) -> list[RankOrder]:
    """Per-rank action orders for ``schedule``; raises ValueError for unsupported input."""
    spec = get_spec(schedule)
    spec.check(stages, microbatches, chunks)
    return _GENERATORS[schedule](stages, microbatches, chunks)


@memo(8)
def shared_orders(schedule: str, stages: int, microbatches: int, chunks: int) -> list[RankOrder]:
    """``build_orders``, remembered for the few shapes in use: one shape's compiled order, live
    walk and in-flight counts each read its orders (read-only: callers never change them)."""
    return build_orders(schedule, stages, microbatches, chunks)


def get_spec(schedule: str) -> ScheduleSpec:
    try:
        return SCHEDULES[schedule]
    except KeyError:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: "
                         f"{', '.join(sorted(SCHEDULES))}") from None
