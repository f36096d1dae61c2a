"""One self-contained HTML report of a search (or of one plan): no network, no external files.

    html = render_report("gpt3-175b", cluster, [(plan, est), ...], estimator,
                         baseline=(bplan, best), baseline_name="megascale")

Sections: summary; top-K table (with ``bands``: each plan's step time p10 / p50 / p90 and MFU
p10–p90 over the run's paired parameter samples, and with ``robust`` its P(best) and worst
regret); evidence (the regimes the chosen plan, the baseline and each top plan lean on that no
timed published run covers, ``cost/evidence.py``); rule verdicts; primitive placement (plan, baseline, the
difference per primitive class); the chosen plan's pipeline schedule as a Gantt chart
(re-simulated from ``Estimate.stage_times_s`` with ``simulate(..., keep_timeline=True)``);
the mesh-to-topology map (which GPUs form each TP/CP/EP/PP/DP group); step-time breakdown
bars; memory per pipeline stage against HBM; attention, SP and CP.

A small inline script sets ``data-report-ok="1"`` on ``<body>`` once it finds every chart,
so a headless browser can confirm that the page loaded and drew (the tests do).
"""
from __future__ import annotations

from collections.abc import Sequence
from html import escape

import autoplan
from autoplan.cost import Estimate, Estimator
from autoplan.cost.evidence import Flag, flags
from autoplan.cost.uncertainty import Band
from autoplan.explain.audit import Audit, Side, audit, shown
from autoplan.explain.expert_mesh import expert_mesh_lines
from autoplan.explain.rules import Verdict
from autoplan.explain.svg import gantt_svg, group_caption, map_window, memory_bars_svg, mesh_map_svg, time_bars_svg
from autoplan.explain.units import AXIS_NAMES, KIND_NAMES, count, percent, seconds, signed_seconds, size
from autoplan.plan import Plan
from costmodels.pipeline import simulate
from topologies.cluster import Cluster

CHART_IDS = ("gantt", "mesh-map", "time-bars", "memory-bars")
MARK = {"pass": "✓ pass", "fail": "✗ FAIL", "warn": "! warn", "info": "i info"}   # no emoji font needed

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1240px;color:#222;
line-height:1.4;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}\
h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}\
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
h3{font-size:1em;margin:14px 0 4px}code{font-size:11.5px}
.pass{color:#17702a}.fail{color:#b00020;font-weight:bold}.warn{color:#a05a00}.info{color:#445}
.maps{display:flex;flex-wrap:wrap;gap:18px}.maps figure{margin:0}.maps figcaption{font-size:12px;max-width:340px}
.note{color:#555;font-size:13px}.kpi{display:flex;gap:26px;flex-wrap:wrap;margin:10px 0}
.kpi div{background:#f6f8fa;border-radius:6px;padding:8px 12px}.kpi b{display:block;font-size:1.3em}
"""

MARKER_JS = """
(function(){var ids=%s;var ok=ids.every(function(id){var e=document.getElementById(id);
return e!==null&&e.querySelector('svg rect')!==null;});
document.body.setAttribute('data-report-ok',ok?'1':'0');})();
""" % ("[" + ",".join(f"'{i}'" for i in CHART_IDS) + "]")


def render_report(model_name: str, cluster: Cluster, ranked: Sequence[tuple[Plan, Estimate]],
                  estimator: Estimator, *, baseline: tuple[Plan, Estimate] | None = None,
                  baseline_name: str = "baseline", top_k: int = 10, title: str | None = None,
                  bands: Sequence[Band | None] | None = None, robust: Sequence | None = None) -> str:
    """The HTML report for ``ranked`` (best first; the first one is audited and drawn).

    ``bands`` / ``robust``: per plan of ``ranked`` (same order), its ``Band`` and its
    ``search.robust.Robust`` record (None where the search ran without bands).
    ``estimator``: the Estimator that priced the plans (its model and cluster); the chosen
    plan is re-priced with full detail when its estimate lacks the primitive table.
    ``baseline``: a hand-written plan and its estimate, shown side by side.
    """
    if not ranked:
        raise ValueError("render_report needs at least one (plan, estimate)")
    model = estimator.model
    best_plan, best = _detailed(estimator, *ranked[0])
    plan_side = Side("plan", best_plan, best)
    base_side = None
    if baseline is not None:
        bplan, best_ = _detailed(estimator, *baseline)
        base_side = Side(baseline_name, bplan, best_)
    a = audit(model, cluster, plan_side, base_side)
    title = title or f"autoplan report: {model_name} on {cluster.name}"
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="note">{escape(a.cluster_text)}. Sequence length {a.seq:,}, global batch '
            f"{a.global_batch:,} sequences ({a.global_batch * a.seq:,} tokens per step).</p>",
            _summary(a, (bands or [None])[0]), _top_k(ranked[:top_k], bands, robust, bool(model.model.experts)),
            _evidence(a), _expert_mesh(a), _verdicts(a), _primitives(a), _gantt(best_plan, best),
            _maps(best_plan, cluster), _time_bars(a), _memory(a), _attention(a),
            f'<p class="note">Generated by autoplan {escape(autoplan.__version__)}. Self-contained: no '
            f"scripts or styles are loaded from anywhere.</p>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + f"\n<script>{MARKER_JS}</script>\n</body></html>\n")


def _detailed(estimator: Estimator, plan: Plan, est: Estimate) -> tuple[Plan, Estimate]:
    """``est``, or a full re-pricing when it lacks the primitive table or the stage times
    (the search prices its inner loop without them)."""
    if est.primitives and est.stage_times_s:
        return plan, est
    return plan, estimator.estimate(plan, est.microbatches * plan.dp * plan.mbs)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for r in rows:
        cells = "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _summary(a: Audit, band: Band | None = None) -> str:
    e = a.plan.estimate
    kpis = [("step time", seconds(e.step_time_s))]
    if band is not None:
        kpis.append(("step p10–p90", f"{seconds(band.step(0.1))} – {seconds(band.step(0.9))}"))
    kpis += [(f"{e.throughput_unit}/s", f"{e.throughput:,.0f}"), ("MFU", percent(e.mfu)),
             ("memory / GPU", f"{e.memory_gib:.1f} of {e.hbm_gib:.1f} GiB"), ("bubble", percent(e.bubble_fraction)),
             ("comm exposed", seconds(e.comm_exposed_s))]
    out = ["<h2>Summary</h2>", f"<p>Chosen plan: <code>{escape(a.plan.plan.to_string())}</code></p>",
           '<div class="kpi">' + "".join(f"<div>{escape(k)}<b>{escape(v)}</b></div>" for k, v in kpis) + "</div>"]
    if a.baseline:
        b = a.baseline.estimate
        out.append(f"<p>Against <b>{escape(a.baseline.label)}</b> (<code>{escape(a.baseline.plan.to_string())}"
                   f"</code>): step {escape(seconds(b.step_time_s))} → {escape(seconds(e.step_time_s))} "
                   f"({b.step_time_s / e.step_time_s:.3f}× throughput), MFU {escape(percent(b.mfu))} → "
                   f"{escape(percent(e.mfu))}, memory {b.memory_gib:.1f} → {e.memory_gib:.1f} GiB.</p>")
    fails = [v for v in a.verdicts if v.status == "fail"]
    if fails:
        out.append(f'<p class="fail">{len(fails)} rule(s) broken: '
                   + "; ".join(escape(v.rule) for v in fails) + "</p>")
    return "\n".join(out)


def _top_k(ranked: Sequence[tuple[Plan, Estimate]], bands: Sequence[Band | None] | None,
           robust: Sequence | None, moe: bool) -> str:
    """The top plans; with bands, the step p10 / p50 / p90, the MFU p10–p90, P(best) and worst
    regret replace tokens/s and bubble; every row lists the regimes it leans on without evidence."""
    banded = bool(bands) and all(b is not None for b in bands[:len(ranked)])  # type: ignore[index]  # bool(bands)
    rows = []
    for i, (p, e) in enumerate(ranked):
        row = [str(i + 1), f"<code>{escape(p.to_string())}</code>", escape(seconds(e.step_time_s))]
        if banded:                              # ignore[index, union-attr]: banded: every band is there
            b, r = bands[i], robust[i] if robust else None  # type: ignore[index]
            row += [" / ".join(escape(seconds(b.step(q))) for q in (0.1, 0.5, 0.9)),  # type: ignore[union-attr]
                    f"{escape(percent(b.mfu(0.1)))} – {escape(percent(b.mfu(0.9)))}",  # type: ignore[union-attr]
                    "—" if r is None else f"{r.p_best:.0%}", "—" if r is None else f"{r.worst_regret:+.1%}"]
        else:
            row += [f"{e.throughput:,.0f}", escape(percent(e.mfu))]
        row += [f"{e.memory_gib:.1f}", "yes" if e.fits else '<span class="fail">no</span>']
        row += [] if banded else [escape(percent(e.bubble_fraction))]
        row += [escape(", ".join(v.rule for v in e.violations)) or "—",
                escape(", ".join(f.regime for f in flags(p, e, moe=moe))) or "—"]
        rows.append(row)
    unit = ranked[0][1].throughput_unit if ranked else "tokens"
    head = (["#", "plan", "step", "step p10 / p50 / p90", "MFU p10–p90", "P(best)", "worst regret", "GiB", "fits"]
            if banded else ["#", "plan", "step", f"{unit}/s", "MFU", "GiB", "fits", "bubble"])
    note = ('<p class="note">Bands: over the run\'s paired samples of the cost model\'s uncertain parameters '
            "(costmodels/uncertainty.yaml); P(best): share of samples where the plan is the fastest listed; "
            "worst regret: its largest slowdown against the fastest listed plan on one sample.</p>") if banded else ""
    return ("<h2>Top plans</h2>" + note
            + _table(head + ["violations", "unvalidated"], rows,
                     numeric=tuple(i for i, h in enumerate(head) if i >= 2 and h != "fits")))


def _flag_list(fl: Sequence[Flag]) -> str:
    if not fl:
        return '<p class="pass">Every regime it leans on has a timed published run.</p>'
    return "<ul>" + "".join(f"<li><b>{escape(f.regime)}</b>: {escape(f.text)}</li>" for f in fl) + "</ul>"


def _evidence(a: Audit) -> str:
    """The regimes the chosen plan (and the baseline) lean on that no timed published run covers."""
    out = ["<h2>Evidence</h2>", '<p class="note">Regimes outside the timed published runs the cost model '
           "was checked against (costmodels/evidence.yaml): the estimate there rests on priors.</p>",
           "<h3>Chosen plan</h3>", _flag_list(a.evidence)]
    if a.baseline:
        out += [f"<h3>{escape(a.baseline.label)}</h3>", _flag_list(a.baseline_evidence)]
    return "\n".join(out)


def _verdict_table(vs: Sequence[Verdict]) -> str:
    rows = [[f'<span class="{v.status}">{escape(MARK[v.status])}</span>', f"<code>{escape(v.rule)}</code>",
             escape(v.text)] for v in vs]
    return _table(["verdict", "rule", "evidence"], rows)


def _expert_mesh(a: Audit) -> str:
    """A folded plan's expert groups (``explain.expert_mesh``); nothing for other plans."""
    if not a.expert_mesh:
        return ""
    head = expert_mesh_lines(a.plan.plan, a.expert_mesh)[2]
    items = "".join(f"<li>{escape(g.text())}</li>" for g in a.expert_mesh)
    return f"<h2>Expert mesh</h2><p>{escape(head)}</p><ul>{items}</ul>"


def _verdicts(a: Audit) -> str:
    out = ["<h2>Rule verdicts</h2>", "<h3>Chosen plan</h3>", _verdict_table(a.verdicts)]
    if a.baseline:
        out += [f"<h3>{escape(a.baseline.label)}</h3>", _verdict_table(a.baseline_verdicts)]
    return "\n".join(out)


def _primitive_table(e: Estimate) -> str:
    rows = [[escape(KIND_NAMES.get(p.kind, p.kind)), escape(AXIS_NAMES.get(p.traffic, p.traffic)), str(p.group_size),
             escape(p.span), count(p.calls_per_step), escape(size(p.bytes_per_call)), escape(seconds(p.time_s)),
             escape(seconds(p.exposed_s)), escape(seconds(p.time_s - p.exposed_s))] for p in shown(e.primitives)]
    rows.append(["<b>total</b>", "", "", "", count(sum(p.calls_per_step for p in shown(e.primitives))), "",
                 f"<b>{escape(seconds(e.comm_time_s))}</b>", f"<b>{escape(seconds(e.comm_exposed_s))}</b>",
                 escape(seconds(e.comm_time_s - e.comm_exposed_s))])
    return _table(["primitive", "axis", "group", "span", "calls/step", "bytes/call", "time/step", "exposed",
                   "overlapped"], rows, numeric=(2, 4, 5, 6, 7, 8))


def _primitives(a: Audit) -> str:
    out = ["<h2>Primitive placement</h2>",
           '<p class="note">Per training step on the busiest pipeline rank; exposed = on the critical path.</p>',
           "<h3>Chosen plan</h3>", _primitive_table(a.plan.estimate)]
    if a.baseline:
        out += [f"<h3>{escape(a.baseline.label)}</h3>", _primitive_table(a.baseline.estimate)]
        rows = [[escape(KIND_NAMES.get(c.kind, c.kind)), escape(AXIS_NAMES.get(c.traffic, c.traffic)),
                 escape(seconds(c.plan_time_s)), escape(seconds(c.base_time_s)), escape(signed_seconds(c.delta_time_s)),
                 escape(seconds(c.plan_exposed_s)), escape(seconds(c.base_exposed_s)),
                 escape(signed_seconds(c.delta_exposed_s))] for c in a.classes]
        out += [f"<h3>Difference per primitive class (plan − {escape(a.baseline.label)})</h3>",
                _table(["primitive", "axis", "plan", a.baseline.label, "Δ", "plan exposed",
                        f"{a.baseline.label} exposed", "Δ exposed"], rows, numeric=(2, 3, 4, 5, 6, 7))]
    return "\n".join(out)


def _gantt(plan: Plan, est: Estimate) -> str:
    f, b, w = (list(x) for x in zip(*est.stage_times_s))
    sends = [p for p in est.primitives if p.kind == "p2p" and p.purpose == "activations"]
    p2p = sends[0].time_s / sends[0].calls_per_step if sends and sends[0].calls_per_step else 0.0
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    sim = simulate(schedule, stages=plan.pp, microbatches=est.microbatches, chunks=plan.vpp, f=f, b=b, w=w,
                   p2p=p2p, keep_timeline=True)
    note = (f"{schedule} on pp = {plan.pp}, vpp = {plan.vpp}, {est.microbatches} micro-batches: simulated "
            f"pipeline time {seconds(sim.step_time)}, bubble {percent(sim.bubble_fraction)}.")
    if schedule == "dualpipev":
        note += (" Drawn without the overlap of one micro-batch's communication under the other's compute "
                 "(the estimate includes it), so pairs look longer than priced.")
    return (f"<h2>Pipeline schedule</h2><p class=\"note\">{escape(note)}</p>"
            f'<div id="gantt">{gantt_svg(sim.timeline, plan.pp, plan.vpp)}</div>')  # type: ignore[arg-type]  # kept


def _maps(plan: Plan, cluster: Cluster) -> str:
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "pp": plan.pp, "dp": plan.cp * plan.dp}
    groups = [g for g in ("tp", "cp", "ep", "pp", "dp") if sizes[g] > 1] or ["dp"]
    window = map_window(cluster)
    note = (f"Cells are GPUs, one column per node ({cluster.gpus_per_node} GPUs), NVLink domains of "
            f"{cluster.nvlink_domain} outlined. Rank 0's group is filled; the next group is lighter.")
    if window < cluster.num_gpus:
        note += (f" Showing the first {window:,} of {cluster.num_gpus:,} GPUs ({window // cluster.gpus_per_node} of "
                 f"{cluster.num_nodes:,} nodes); groups reaching further are described in the captions.")
    figs = [f'<figure><figcaption><b>{escape(g.upper())}</b> — {escape(group_caption(plan, cluster, g))}'
            f"</figcaption>{mesh_map_svg(plan, cluster, g)}</figure>" for g in groups]
    return (f"<h2>Mesh on the topology</h2><p class=\"note\">{escape(note)}</p>"
            f'<div id="mesh-map" class="maps">{"".join(figs)}</div>')


def _breakdown(e: Estimate) -> dict[str, float]:
    items = dict(e.time_breakdown_s)
    compute = items.pop("compute", 0.0)
    recompute = compute * (e.hfu - e.mfu) / e.hfu if e.hfu > 0 else 0.0
    items["compute"], items["recompute"] = compute - recompute, recompute
    rest = e.step_time_s - sum(items.values())
    if rest > 1e-9 * e.step_time_s:
        items["other"] = rest
    return items


def _time_bars(a: Audit) -> str:
    rows = [("plan", _breakdown(a.plan.estimate), a.plan.estimate.step_time_s)]
    if a.baseline:
        rows.append((a.baseline.label, _breakdown(a.baseline.estimate), a.baseline.estimate.step_time_s))
    return ("<h2>Step time breakdown</h2><p class=\"note\">Seconds per training step on the busiest pipeline "
            "rank; communication counts only where it is exposed (TP/SP collectives are all exposed).</p>"
            f'<div id="time-bars">{time_bars_svg(rows)}</div>')


def _memory(a: Audit) -> str:
    figs = []
    for s in [a.plan] + ([a.baseline] if a.baseline else []):
        e = s.estimate
        figs.append(f"<figure><figcaption><b>{escape(s.label)}</b>: fullest stage {e.memory_gib:.1f} GiB of "
                    f"{e.hbm_gib:.1f} GiB</figcaption>"
                    f"{memory_bars_svg(e.memory_per_stage_gib or (e.memory_gib,), e.memory_breakdown_gib, e.hbm_gib)}"
                    "</figure>")
    return f'<h2>Memory per GPU</h2><div id="memory-bars" class="maps">{"".join(figs)}</div>'


def _attention(a: Audit) -> str:
    at = a.attention
    return (f"<h2>Attention, SP and CP</h2><p>Attention is {escape(percent(at.time_share))} of the busiest rank's "
            f"block compute time and {escape(percent(at.flops_share))} of the model FLOPs at sequence length "
            f"{at.seq:,}.</p><ul><li>{escape(at.sp)}</li><li>{escape(at.cp)}</li></ul>")
