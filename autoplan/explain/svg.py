"""Inline SVG charts for the HTML report: pipeline Gantt, mesh-to-topology map, bars.

Every function returns one ``<svg>`` element as a string (no scripts, no external
references), sized in CSS pixels.  Sizes stay bounded for big runs: a Gantt chart with many
operations is binned to one rectangle per pixel column run, and the mesh map draws at most
``MAP_MAX_GPUS`` GPUs (whole NVLink domains) and says so.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from autoplan.explain.units import ranks_text, seconds
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from costmodels.pipeline import TimelineEntry
from topologies.cluster import Cluster

OP_COLOURS = {"F": "#4e79a7", "B": "#e15759", "W": "#59a14f", "BW": "#b07aa1"}
AXIS_COLOURS = {"tp": "#4e79a7", "cp": "#59a14f", "ep": "#f28e2b", "pp": "#b07aa1", "dp": "#e15759"}
TIME_COLOURS = {"compute": "#4e79a7", "recompute": "#a0cbe8", "tp_comm": "#f28e2b", "cp_comm_exposed": "#59a14f",
                "ep_comm_exposed": "#8cd17d", "pp_bubble": "#bab0ac", "pp_p2p_exposed": "#b07aa1",
                "pp_engine_host": "#d4a6c8", "dp_exposed": "#e15759", "embed_sync": "#ff9d9a", "optimizer": "#9c755f",
                "other": "#d7d7d7"}
TIME_LABELS = {"compute": "model compute", "recompute": "recompute", "tp_comm": "TP/SP comm",
               "cp_comm_exposed": "CP comm (exposed)", "ep_comm_exposed": "EP all-to-all (exposed)",
               "pp_bubble": "pipeline bubble", "pp_p2p_exposed": "PP P2P (exposed)",
               "pp_engine_host": "PP engine host", "dp_exposed": "DP comm (exposed)",
               "embed_sync": "embedding sync", "optimizer": "optimizer", "other": "other"}
MEMORY_COLOURS = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#59a14f", "activations": "#e15759",
                  "other": "#bab0ac"}
GANTT_EXACT_MAX = 8000       # more operations than this are binned per pixel column
GANTT_TITLES_MAX = 3000      # tooltips only below this
MAP_MAX_GPUS = 1024
FONT = 'font-family="sans-serif" font-size="11"'


def _lighten(hex_colour: str, amount: float) -> str:
    """Mix a #rrggbb colour with white (amount 0 = unchanged, 1 = white)."""
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def _tick_step(span: float, target: int = 8) -> float:
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _axis(x0: float, y: float, width: float, span: float) -> list[str]:
    """A time axis from 0 to ``span`` seconds under a chart."""
    out = [f'<line x1="{x0}" y1="{y}" x2="{x0 + width}" y2="{y}" stroke="#333"/>']
    step = _tick_step(span)
    t = 0.0
    while t <= span * 1.0001:
        x = x0 + width * t / span
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 15}" text-anchor="middle" {FONT}>{escape(seconds(t))}</text>')
        t += step
    return out


# --- pipeline Gantt ------------------------------------------------------------------------------

def gantt_svg(timeline: Sequence[TimelineEntry], stages: int, chunks: int, *, width: int = 960,
              row: int = 16) -> str:
    """Gantt chart of one step: one row per pipeline rank, F/B/W/BW coloured, later model
    chunks (virtual stages) lighter."""
    step = max((e.end for e in timeline), default=0.0) or 1.0
    left, top = 60, 8
    height = top + stages * row + 44
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart gantt" width="{left + width + 10}" '
           f'height="{height}" viewBox="0 0 {left + width + 10} {height}" role="img">']
    for r in range(stages):
        y = top + r * row
        out.append(f'<text x="{left - 6}" y="{y + row - 4}" text-anchor="end" {FONT}>rank {r}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{width}" height="{row - 2}" fill="#f4f4f4"/>')

    def colour(kind: str, vs: int) -> str:
        chunk = vs // stages
        return _lighten(OP_COLOURS.get(kind, "#888888"), 0.5 * chunk / max(chunks - 1, 1) if chunks > 1 else 0.0)

    scale = width / step
    if len(timeline) <= GANTT_EXACT_MAX:
        titles = len(timeline) <= GANTT_TITLES_MAX
        for e in timeline:
            x, w = left + e.start * scale, max((e.end - e.start) * scale, 0.3)
            y = top + e.rank * row
            tip = (f"<title>{e.kind} micro-batch {e.microbatch}, virtual stage {e.virtual_stage}: "
                   f"{seconds(e.start)}–{seconds(e.end)}</title>") if titles else ""
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 2}" '
                       f'fill="{colour(e.kind, e.virtual_stage)}">{tip}</rect>')
    else:
        for r in range(stages):
            for x0, x1, kind, vs in _binned(sorted((e for e in timeline if e.rank == r), key=lambda e: e.start),
                                            step, width):
                out.append(f'<rect x="{left + x0}" y="{top + r * row}" width="{x1 - x0}" height="{row - 2}" '
                           f'fill="{colour(kind, vs)}"/>')
    out += _axis(left, top + stages * row + 2, width, step)
    lx = left
    for kind, c in OP_COLOURS.items():
        if any(e.kind == kind for e in timeline):
            out.append(f'<rect x="{lx}" y="{height - 12}" width="10" height="10" fill="{c}"/>')
            out.append(f'<text x="{lx + 14}" y="{height - 3}" {FONT}>{kind}</text>')
            lx += 44
    if chunks > 1:
        out.append(f'<text x="{lx + 10}" y="{height - 3}" {FONT}>lighter = later model chunk '
                   f'(vpp = {chunks})</text>')
    out.append("</svg>")
    return "\n".join(out)


def _binned(entries: list[TimelineEntry], step: float, width: int) -> list[tuple[int, int, str, int]]:
    """Runs of pixel columns whose centre falls in an op of the same kind and chunk."""
    runs: list[list] = []
    i = 0
    for px in range(width):
        t = (px + 0.5) * step / width
        while i < len(entries) and entries[i].end <= t:
            i += 1
        if i < len(entries) and entries[i].start <= t:
            key = (entries[i].kind, entries[i].virtual_stage)
            if runs and runs[-1][1] == px and runs[-1][2:] == list(key):
                runs[-1][1] = px + 1
            else:
                runs.append([px, px + 1, *key])
    return [tuple(r) for r in runs]


# --- mesh-to-topology map ------------------------------------------------------------------------

def map_window(cluster: Cluster, max_gpus: int = MAP_MAX_GPUS) -> int:
    """GPUs drawn: all of them, or the first whole NVLink domains up to ``max_gpus``."""
    if cluster.num_gpus <= max_gpus:
        return cluster.num_gpus
    return max(cluster.nvlink_domain, (max_gpus // cluster.nvlink_domain) * cluster.nvlink_domain)


def mesh_map_svg(plan: Plan, cluster: Cluster, group: str, *, max_gpus: int = MAP_MAX_GPUS) -> str:
    """Which GPUs form the ``group`` ("tp", "cp", "ep", "pp" or "dp") groups.

    GPUs are cells, one column per node (GPU 0 of the node on top), nodes left to right,
    NVLink domains outlined, one row of nodes per line.  The group of rank 0 is filled in the
    axis colour, the next group (the one holding the lowest rank outside the first) in a
    lighter shade; the other groups are grey.
    """
    mesh = Mesh.of(plan)
    shown = map_window(cluster, max_gpus)
    first = mesh.group(group, 0)
    members = set(first)
    outside = next((r for r in range(plan.num_gpus) if r not in members), None)
    second = mesh.group(group, outside) if outside is not None else ()
    fill = {r: AXIS_COLOURS[group] for r in first}
    fill.update({r: _lighten(AXIS_COLOURS[group], 0.55) for r in second})

    g = cluster.gpus_per_node
    nodes_per_domain = max(1, cluster.nvlink_domain // g)
    nodes_per_row = nodes_per_domain * max(1, 32 // nodes_per_domain)
    cell, gap, domain_gap, row_gap, left, top = 7, 1, 4, 14, 4, 4
    nodes = -(-shown // g)
    rows = -(-nodes // nodes_per_row)
    col_w = cell + gap
    row_w = nodes_per_row * col_w + (nodes_per_row // nodes_per_domain) * domain_gap
    row_h = g * (cell + gap) + row_gap
    width = left + row_w + 4
    height = top + rows * row_h + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart mesh" data-group="{group}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for n in range(nodes):
        row, col = divmod(n, nodes_per_row)
        x = left + col * col_w + (col // nodes_per_domain) * domain_gap
        y = top + row * row_h
        if n % nodes_per_domain == 0:
            span_nodes = min(nodes_per_domain, nodes - n)
            out.append(f'<rect x="{x - 1.5}" y="{y - 1.5}" width="{span_nodes * col_w + 2}" '
                       f'height="{g * (cell + gap) + 2}" fill="none" stroke="#777" stroke-width="1"/>')
        for k in range(g):
            r = n * g + k
            if r >= shown:
                break
            out.append(f'<rect x="{x}" y="{y + k * (cell + gap)}" width="{cell}" height="{cell}" '
                       f'fill="{fill.get(r, "#e3e3e3")}"><title>GPU {r} (node {n})</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def group_caption(plan: Plan, cluster: Cluster, group: str) -> str:
    """One line under a map: group size, rank 0's members and the link they use."""
    mesh = Mesh.of(plan)
    ranks = mesh.group(group, 0)
    span = cluster.span(ranks)
    names = {"tp": "TP", "cp": "CP", "ep": "EP", "pp": "PP", "dp": "DP (dense: cp·ep·dp)"}
    return (f"{names[group]} groups of {len(ranks)}: rank 0's group is {ranks_text(ranks)}, "
            f"{span.nodes} node(s), {span.domains} NVLink domain(s), over {cluster.describe_span(span)}")


# --- bars ----------------------------------------------------------------------------------------

def time_bars_svg(rows: Sequence[tuple[str, dict[str, float], float]], *, width: int = 720) -> str:
    """One horizontal stacked bar per contender: (label, seconds per item, step time)."""
    left, bar, gap, top = 150, 22, 12, 6
    longest = max((step for _, _, step in rows), default=1.0) or 1.0
    keys = [k for k in TIME_COLOURS if any(items.get(k, 0) > 0 for _, items, _ in rows)]
    legend_rows = -(-len(keys) // 5)
    height = top + len(rows) * (bar + gap) + 24 + legend_rows * 16 + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars" width="{left + width + 80}" '
           f'height="{height}" viewBox="0 0 {left + width + 80} {height}" role="img">']
    for i, (label, items, step) in enumerate(rows):
        y = top + i * (bar + gap)
        out.append(f'<text x="{left - 6}" y="{y + bar - 7}" text-anchor="end" {FONT}>{escape(label)}</text>')
        x = float(left)
        for k in keys:
            v = items.get(k, 0.0)
            if v <= 0:
                continue
            w = width * v / longest
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar}" fill="{TIME_COLOURS[k]}">'
                       f'<title>{escape(TIME_LABELS[k])}: {escape(seconds(v))}</title></rect>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + bar - 7}" {FONT}>{escape(seconds(step))}</text>')
    out += _axis(left, top + len(rows) * (bar + gap), width, longest)
    for j, k in enumerate(keys):
        lx = left + (j % 5) * 140
        ly = top + len(rows) * (bar + gap) + 24 + (j // 5) * 16
        out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{TIME_COLOURS[k]}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly + 9}" {FONT}>{escape(TIME_LABELS[k])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def memory_bars_svg(per_stage_gib: Sequence[float], breakdown_gib: dict[str, float], hbm_gib: float, *,
                    height: int = 200) -> str:
    """Memory per pipeline stage against HBM (dashed line), and the fullest stage's breakdown."""
    left, top, bottom = 44, 10, 34
    n = max(len(per_stage_gib), 1)
    bar = max(4, min(28, 480 // n))
    gap = max(1, bar // 4)
    top_gib = max([hbm_gib, *per_stage_gib, sum(breakdown_gib.values())]) * 1.08
    stages_w = max(n * (bar + gap), 170)          # room for the axis label under few stages
    width = left + stages_w + 40 + 60 + 200
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart memory" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img">']
    plot_h = height - top - bottom

    def y_of(gib: float) -> float:
        return top + plot_h * (1 - gib / top_gib)

    for i, gib in enumerate(per_stage_gib):
        x = left + i * (bar + gap)
        over = gib > hbm_gib
        out.append(f'<rect x="{x}" y="{y_of(gib):.1f}" width="{bar}" height="{top + plot_h - y_of(gib):.1f}" '
                   f'fill="{"#e15759" if over else "#4e79a7"}"><title>stage {i}: {gib:.1f} GiB</title></rect>')
    # fullest stage, stacked
    sx = left + stages_w + 40
    acc = 0.0
    for k, c in MEMORY_COLOURS.items():
        v = breakdown_gib.get(k, 0.0)
        if v <= 0:
            continue
        out.append(f'<rect x="{sx}" y="{y_of(acc + v):.1f}" width="28" height="{y_of(acc) - y_of(acc + v):.1f}" '
                   f'fill="{c}"><title>{k}: {v:.1f} GiB</title></rect>')
        acc += v
    hy = y_of(hbm_gib)
    out.append(f'<line x1="{left - 4}" y1="{hy:.1f}" x2="{sx + 40}" y2="{hy:.1f}" stroke="#000" '
               f'stroke-dasharray="5,3"/>')
    out.append(f'<text x="{sx + 44}" y="{hy + 4:.1f}" {FONT}>HBM {hbm_gib:.1f} GiB</text>')
    out.append(f'<line x1="{left - 4}" y1="{top + plot_h}" x2="{sx + 40}" y2="{top + plot_h}" stroke="#333"/>')
    for gib in range(0, int(top_gib) + 1, max(10, int(_tick_step(top_gib, 5)))):
        out.append(f'<text x="{left - 8}" y="{y_of(gib) + 4:.1f}" text-anchor="end" {FONT}>{gib}</text>')
    out.append(f'<text x="{left}" y="{height - 18}" {FONT}>pipeline stages 0…{n - 1} (GiB per GPU)</text>')
    out.append(f'<text x="{sx - 6}" y="{height - 6}" {FONT}>fullest stage</text>')
    for j, (k, c) in enumerate(MEMORY_COLOURS.items()):
        ly = top + 8 + j * 16
        out.append(f'<rect x="{sx + 120}" y="{ly}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{sx + 134}" y="{ly + 9}" {FONT}>{k} {breakdown_gib.get(k, 0.0):.1f}</text>')
    out.append("</svg>")
    return "\n".join(out)
