"""The ranked table of plans ``search`` prints: compact plans, what differs marked, ties named.

* Plans are shown in the compact notation (``autoplan.plan_notation``; ``--wide``: the canonical
  string), never cut: the numbers keep their width, a plan longer than the room left wraps
  between its tokens (the mesh, joined by ``·``, stays one word).
* A token that not every listed plan shares (``cp2`` against ``dp64``, ``ulysses`` against ring)
  is bold: that is what to compare.
* With uncertainty bands (``search --samples N``, the default) the table adds each plan's
  p10–p90 step time, how often it is the best of the listed plans over the samples and its
  worst-case regret, ranks by the search's objective, and names the regimes no timed published
  run covers (``unvalidated``).
* Plans whose scores (step time, or the objective's score) are within ``TIE_TOLERANCE`` of the
  first of their run share a rank
  (``1=``): a difference that small (5 ms on a 1 s step) is below what the cost model resolves —
  it reproduces published runs to 3.6 % on average — so the order between them is no advice.
"""
from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

TIE_TOLERANCE = 0.005          # relative step-time difference below which two plans tie


def tie_ranks(step_times: list[float], tolerance: float = TIE_TOLERANCE) -> list[str]:
    """Rank labels of plans sorted by step time: "1", "2", or "3=" for every member of a run of
    plans whose step times are within ``tolerance`` (relative) of the run's first."""
    groups: list[list[int]] = []
    for i, t in enumerate(step_times):
        if groups and t <= step_times[groups[-1][0]] * (1 + tolerance):
            groups[-1].append(i)
        else:
            groups.append([i])
    labels = [""] * len(step_times)
    for g in groups:
        for i in g:
            labels[i] = f"{g[0] + 1}=" if len(g) > 1 else str(g[0] + 1)
    return labels


def plan_cells(plans: list, wide: bool = False) -> list[Text]:
    """One cell per plan: its compact tokens (mesh axes joined by ``·``), bold where not every
    plan has the same token; with ``wide`` the canonical ``key=value`` items."""
    from autoplan.plan_notation import is_axis_token

    token_lists = [p.to_string().split(",") if wide else list(p.compact_tokens()) for p in plans]
    shared = set.intersection(*(set(t) for t in token_lists)) if len(plans) > 1 else None
    cells = []
    for tokens in token_lists:
        text = Text()
        for i, tok in enumerate(tokens):
            if i:
                text.append("," if wide else "·" if is_axis_token(tokens[i - 1]) and is_axis_token(tok) else " ")
            text.append(tok, style="bold" if shared is not None and tok not in shared else "")
        cells.append(text)
    return cells


DROPPABLE = ("unvalidated", "comm", "bubble", "memory")    # columns left out, in this order, when narrow


def scores(candidates: list) -> list[float]:
    """What the ranking compares: the objective's score where the search ranked by one, else the
    step time."""
    return [c.robust.score if getattr(c, "robust", None) is not None else c.estimate.step_time_s
            for c in candidates]


def plans_table(candidates: list, unit: str, *, wide: bool = False, width: int = 200,
                objective: str | None = None) -> Table:
    """The ranked table of (plan, estimate) candidates; ``unit`` is "tokens" or "samples".  The
    plan column takes the room the numbers leave on a ``width``-column terminal and wraps between
    tokens; when even a plan's longest token would not fit, the columns of ``DROPPABLE`` go first."""
    from rich.console import Console

    from autoplan.explain.units import percent, seconds

    if not candidates:
        return Table(title="no plan")
    from autoplan.commands.common import band_text

    cells = plan_cells([c.plan for c in candidates], wide)
    ranks = tie_ranks(scores(candidates))
    es = [c.estimate for c in candidates]
    banded = getattr(candidates[0], "band", None) is not None
    numbers = {"step": ("step", [seconds(e.step_time_s) for e in es])}
    if banded:
        numbers.update({"band": ("p10–p90", [band_text(c.band.fields()) for c in candidates]),
                        "best": ("best", [percent(c.robust.p_best) for c in candidates]),
                        "regret": ("regret≤", [percent(c.robust.worst_regret) for c in candidates])})
    numbers.update({
               "throughput": (f"{unit}/s", [f"{e.throughput:,.0f}" for e in es]),
               "mfu": ("MFU", [percent(e.mfu) for e in es]),
               "memory": (f"GiB / {es[0].memory_limit_gib:.1f}", [f"{e.memory_gib:.1f}" for e in es]),   # one cluster
               "bubble": ("bubble", [percent(e.bubble_fraction) for e in es]),
               "comm": ("comm exp.", [seconds(e.comm_exposed_s) for e in es])})
    if banded:          # the band's three columns take the room of throughput, bubble and exposed comm
        for key in ("throughput", "bubble", "comm"):
            numbers.pop(key)
    if any(getattr(c, "evidence", ()) for c in candidates):
        numbers["unvalidated"] = ("unvalidated", [",".join(f.regime for f in c.evidence) or "-" for c in candidates])
    title = f"Top {len(candidates)} distinct meshes" + (f", ranked by {objective}" if banded and objective else "")
    longest_word = max((len(w) for cell in cells for w in cell.plain.split()), default=4)
    measure = Console(width=10_000)
    for dropped in range(len(DROPPABLE) + 1):
        shown = [v for k, v in numbers.items() if k not in DROPPABLE[:dropped]]
        for plan_w in range(max(len(c.plain) for c in cells), longest_word - 1, -1):
            table = _table(title, ranks, cells, shown, plan_w)
            if measure.measure(table).maximum <= width:
                return table
    return table


def _table(title: str, ranks: list[str], cells: list[Text], numbers: list[tuple[str, list[str]]],
           plan_w: int) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, show_edge=False,
                  pad_edge=False, padding=(0, 1, 0, 0))   # and the box's one-space divider
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("plan", width=plan_w)     # the one column that wraps: between tokens, never inside
    for header, _ in numbers:
        table.add_column(header, justify="right", no_wrap=True)
    for i, (rank, cell) in enumerate(zip(ranks, cells)):
        table.add_row(rank, cell, *(values[i] for _, values in numbers))
    return table


def tie_note(candidates: list) -> str:
    """A line naming the tied ranks, or "" when no two plans tie."""
    ranks = tie_ranks(scores(candidates))
    tied = sorted({r for r in ranks if r.endswith("=")}, key=lambda r: int(r[:-1]))
    if not tied:
        return ""
    what = "scores" if getattr(candidates[0], "robust", None) is not None else "step times"
    return f"{', '.join(tied)}: ties — {what} within {TIE_TOLERANCE:.1%} of each other: below what the model resolves"
