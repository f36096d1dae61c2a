"""Textbook bubble and memory formulas of the pipeline schedules: the simulator's oracles.

Notation: p = pipeline ranks, m = micro-batches, v = chunks per rank; f, b, w = seconds of
one micro-batch's forward, input-gradient backward and weight-gradient backward on one
virtual stage (all stages equal, p2p = 0).  Compute per rank = m·v·(f+b+w).  A rank's
*bubble* is its idle time during the step.  The papers write B for the input-gradient
backward (Qi et al.) or for the full backward b+w (DeepSeek's DualPipe README); below,
b is always the input-gradient part, so DualPipe's "(PP−1)(F+B−2W)" for ZB1P reads
(p−1)(f+b−w) here.

schedule     bubble per rank        basis   holds for                     source
gpipe        (p−1)(f+b+w)           step    any m                         Huang et al. 2019
1f1b         (p−1)(f+b+w)           step    any m                         Narayanan SC'21 §2.2.1
interleaved  (p−1)(f+b+w) per chunk step    m >= p                        Narayanan SC'21 §2.2.2
zb-h1        (p−1)(f+b−w)           step    m >= p, w <= min(f, b)        DualPipe README (ZB1P)
zb-h2        (p−1)(f+b−2w)          steady  m >= 2p−1, w <= f, 2w <= f+b  see below
zbv          0                      steady  m >= 2p−1, f = b = w          Qi et al. 2401.10241 §6
dualpipev    (p−1)(F&B + B − 3W)    step    m >= 2p, f = b, w <= f        DualPipe README, PP=2p

Interleaved per chunk: with full-stage times F = v·f etc. the bubble is (p−1)(F+B+W)/v and
the bubble ratio (p−1)/(v·m) — v times smaller than 1F1B's (p−1)/m.  ZB-H1 at f=b=w is a
third of 1F1B's (Qi et al. ICLR'24 §2.1, README table "(p−1)/3m"); ZB-H2 and ZB-V reach
zero (§2.2, §6).  The general ZB-H2 form is what our order gives, tested against the
simulator; at f = b = w it is the paper's zero.  For DualPipeV, F&B is an overlapped pair
(f+b+w without communication to hide), B the full backward b+w and W = w, so the bubble is
(p−1)(f+2b−w); the README's PP is DualPipe's rank count, i.e. 2p virtual stages here.

*Basis* says which simulator figure the formula predicts: ``step`` → PipelineResult
.bubble_time (makespan); ``steady`` → .steady_bubble_time (ranks start the next step as
soon as they finish: the parallelogram of ZB-H2/ZB-V, which needs the paper's optimizer
post-validation; at f = b = w their makespan still shows (p−1)·f of fill skew).

Outside the "holds for" range the handcrafted orders are no longer bubble-optimal and only
the simulator knows the answer; closed_form_bubble raises ValueError there.
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.pipeline.schedules import get_spec, interleaved_group_size


@dataclass(frozen=True)
class ClosedFormBubble:
    """A paper's bubble for equal stages: idle seconds per rank and idle/compute ratio."""

    bubble_time: float
    bubble_ratio: float
    basis: str            # "step" or "steady", see module docstring
    formula: str
    source: str


def closed_form_bubble(schedule: str, p: int, m: int, v: int = 1, *, f: float = 1.0,
                       b: float = 1.0, w: float = 1.0) -> ClosedFormBubble:
    """The textbook bubble of ``schedule`` (table in the module docstring)."""
    get_spec(schedule).check(p, m, v)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"no closed form for {schedule} unless {what} "
                             f"(got p={p}, m={m}, f={f}, b={b}, w={w})")

    if schedule in ("gpipe", "1f1b"):
        t, basis, formula = (p - 1) * (f + b + w), "step", "(p-1)(f+b+w)"
        source = "Huang et al. 2019; Narayanan et al. SC'21 §2.2.1"
    elif schedule == "interleaved":
        need(m >= p, "m >= p")
        t, basis, formula = (p - 1) * (f + b + w), "step", "(p-1)(f+b+w) per chunk"
        source = "Narayanan et al. SC'21 §2.2.2"
    elif schedule == "zb-h1":
        need(m >= p and w <= min(f, b), "m >= p and w <= min(f, b)")
        t, basis, formula = (p - 1) * (f + b - w), "step", "(p-1)(f+b-w)"
        source = "deepseek-ai/DualPipe README (ZB1P); Qi et al. ICLR'24 §2.1"
    elif schedule == "zb-h2":
        need(m >= 2 * p - 1 and w <= f and 2 * w <= f + b, "m >= 2p-1, w <= f and 2w <= f+b")
        t, basis, formula = (p - 1) * (f + b - 2 * w), "steady", "(p-1)(f+b-2w)"
        source = "Qi et al. ICLR'24 §2.2 (zero at f=b=w); general form from this order"
    elif schedule == "zbv":
        need(m >= 2 * p - 1 and f == b == w, "m >= 2p-1 and f = b = w")
        t, basis, formula = 0.0, "steady", "0"
        source = "Qi et al. arXiv 2401.10241 §6"
    elif schedule == "dualpipev":
        need(f == b and w <= f, "f = b and w <= f")
        fb_pair, full_b = f + b + w, b + w
        t, basis, formula = (p - 1) * (fb_pair + full_b - 3 * w), "step", "(p-1)(F&B+B-3W)"
        source = "deepseek-ai/DualPipe README (PP = 2p virtual stages)"
    else:  # a schedule added to SCHEDULES without a formula here
        raise ValueError(f"no closed form for {schedule}")
    compute = m * v * (f + b + w)
    return ClosedFormBubble(t, t / compute if compute > 0 else 0.0, basis, formula, source)


def closed_form_peak_activations(schedule: str, p: int, m: int, v: int = 1) -> tuple[int, ...]:
    """Per-rank peak of live forward chunks (micro-batch × chunk units), counted until the
    op that ends the backward (BW, or W when split), as PipelineResult.peak_activations.

    gpipe        m on every rank (all forwards before any backward)
    1f1b         min(p − r, m) on rank r: p−1−r warm-up forwards + 1 (Narayanan et al.)
    interleaved  min(2(p−r−1) + (v−1)·g + 1, m·v), g = group size (p when p | m) —
                 Megatron's get_pp_rank_microbatches warm-up + 1; rank 0: (v+1)p − 1
    zb-h1        min(p, m) on every rank: the W's rank r holds back raise it from
                 1F1B's p−r to p, never above 1F1B's rank-0 peak (Qi et al. §2.1)
    zb-h2        min(2p − 1, m) on every rank (Qi et al. §2.2: "(2p−1) M_B")
    zbv          min(2p, 2m, m + r + 1); 2p chunks = p stages, 1F1B's peak, once
                 m >= 2p − 1 (Qi et al. §6)
    dualpipev    2p + 1 chunks on every rank: DeepSeek's "PP + 1" with PP = 2p
    """
    get_spec(schedule).check(p, m, v)
    ranks = range(p)
    if schedule == "gpipe":
        return tuple(m for _ in ranks)
    if schedule == "1f1b":
        return tuple(min(p - r, m) for r in ranks)
    if schedule == "interleaved":
        g = interleaved_group_size(p, m)
        return tuple(min(2 * (p - r - 1) + (v - 1) * g + 1, m * v) for r in ranks)
    if schedule == "zb-h1":
        return tuple(min(p, m) for _ in ranks)
    if schedule == "zb-h2":
        return tuple(min(2 * p - 1, m) for _ in ranks)
    if schedule == "zbv":
        return tuple(min(2 * p, 2 * m, m + r + 1) for r in ranks)
    if schedule == "dualpipev":
        return tuple(2 * p + 1 for _ in ranks)
    raise ValueError(f"no closed form for {schedule}")
