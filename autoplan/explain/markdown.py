"""The audit as Markdown: summary, primitive placement (plan and baseline), the difference per
primitive class, rule verdicts with evidence, and the attention note."""
from __future__ import annotations

from autoplan.cost import Estimate
from autoplan.explain.audit import Audit, Side, shown
from autoplan.explain.expert_mesh import expert_mesh_lines
from autoplan.explain.rules import Verdict
from autoplan.explain.units import AXIS_NAMES, KIND_NAMES, count, percent, seconds, signed_seconds, size

MARK = {"pass": "✅ pass", "fail": "❌ FAIL", "warn": "⚠️ warn", "info": "ℹ️ info"}


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column, l or r (default l)."""
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


PRIMITIVE_HEADER = ["primitive", "axis", "group", "span", "calls/step", "bytes/call", "time/step", "exposed",
                    "overlapped"]


def primitive_rows(est: Estimate) -> list[list[str]]:
    rows = [[KIND_NAMES.get(p.kind, p.kind), AXIS_NAMES.get(p.traffic, p.traffic), str(p.group_size), p.span,
             count(p.calls_per_step), size(p.bytes_per_call), seconds(p.time_s), seconds(p.exposed_s),
             seconds(p.time_s - p.exposed_s)] for p in shown(est.primitives)]
    t = sum(p.time_s for p in est.primitives)
    x = sum(p.exposed_s for p in est.primitives)
    rows.append(["**total**", "", "", "", count(sum(p.calls_per_step for p in shown(est.primitives))), "",
                 f"**{seconds(t)}**", f"**{seconds(x)}**", seconds(t - x)])
    return rows


def side_summary(s: Side) -> list[str]:
    e = s.estimate
    return [s.label, f"`{s.plan.to_string()}`", seconds(e.step_time_s), f"{e.throughput:,.0f}",
            percent(e.mfu), f"{e.memory_gib:.1f} / {e.hbm_gib:.1f}", percent(e.bubble_fraction),
            seconds(e.comm_time_s), seconds(e.comm_exposed_s)]


def verdict_rows(vs: tuple[Verdict, ...]) -> list[list[str]]:
    return [[MARK[v.status], f"`{v.rule}`", v.text] for v in vs]


def render_markdown(a: Audit) -> str:
    out = [f"# autoplan audit: {a.model} on {a.cluster}", "",
           f"{a.cluster_text}. Sequence length {a.seq:,}, global batch {a.global_batch:,} sequences "
           f"({a.global_batch * a.seq:,} tokens per step).", ""]
    sides = [a.plan] + ([a.baseline] if a.baseline else [])
    out += ["## Summary", "",
            table(["", "plan", "step", f"{a.plan.estimate.throughput_unit}/s", "MFU", "memory GiB / HBM", "bubble",
                   "comm", "comm exposed"],
                  [side_summary(s) for s in sides], "llrrrrrrr"), ""]
    if a.baseline:
        p, b = a.plan.estimate, a.baseline.estimate
        out += [f"Plan vs {a.baseline.label}: step {signed_seconds(p.step_time_s - b.step_time_s)} "
                f"({b.step_time_s / p.step_time_s:.3f}× the baseline's throughput), MFU "
                f"{(p.mfu - b.mfu) * 100:+.1f} points, memory {p.memory_gib - b.memory_gib:+.1f} GiB, "
                f"exposed communication {signed_seconds(p.comm_exposed_s - b.comm_exposed_s)}.", ""]
    for s in sides:
        out += [f"## Primitive placement: {s.label}", "",
                "Per training step on the busiest pipeline rank; *exposed* = on the critical path.", "",
                table(PRIMITIVE_HEADER, primitive_rows(s.estimate), "llrlrrrrr"), ""]
    if a.baseline:
        rows = [[KIND_NAMES.get(c.kind, c.kind), AXIS_NAMES.get(c.traffic, c.traffic), seconds(c.plan_time_s),
                 seconds(c.base_time_s), signed_seconds(c.delta_time_s), seconds(c.plan_exposed_s),
                 seconds(c.base_exposed_s), signed_seconds(c.delta_exposed_s)] for c in a.classes]
        p, b = a.plan.estimate, a.baseline.estimate
        rows.append(["**all**", "", seconds(p.comm_time_s), seconds(b.comm_time_s),
                     signed_seconds(p.comm_time_s - b.comm_time_s), seconds(p.comm_exposed_s),
                     seconds(b.comm_exposed_s), signed_seconds(p.comm_exposed_s - b.comm_exposed_s)])
        out += [f"## Difference per primitive class (plan − {a.baseline.label})", "",
                table(["primitive", "axis", "plan", a.baseline.label, "Δ", "plan exposed",
                       f"{a.baseline.label} exposed", "Δ exposed"], rows, "llrrrrrr"), "",
                table(["", "plan", a.baseline.label, "Δ"], [
                    ["step time", seconds(p.step_time_s), seconds(b.step_time_s),
                     signed_seconds(p.step_time_s - b.step_time_s)],
                    ["memory per GPU", f"{p.memory_gib:.1f} GiB", f"{b.memory_gib:.1f} GiB",
                     f"{p.memory_gib - b.memory_gib:+.1f} GiB"],
                    ["MFU", percent(p.mfu), percent(b.mfu), f"{(p.mfu - b.mfu) * 100:+.1f} pt"]], "lrrr"), ""]
    if a.precision is not None:
        out += ["## Precision", "", a.precision.text() + ".", ""]
    out += expert_mesh_lines(a.plan.plan, a.expert_mesh)
    out += ["## Rule verdicts: plan", "", table(["verdict", "rule", "evidence"], verdict_rows(a.verdicts)), ""]
    if a.baseline:
        out += [f"## Rule verdicts: {a.baseline.label}", "",
                table(["verdict", "rule", "evidence"], verdict_rows(a.baseline_verdicts)), ""]
    for label, fl in (("plan", a.evidence), *(((a.baseline.label, a.baseline_evidence),) if a.baseline else ())):
        out += [f"## Evidence: {label}", "",
                *([f"- **{f.regime}**: {f.text}" for f in fl]
                  or ["Every regime it leans on has a timed published run."]),
                ""]
    at = a.attention
    out += ["## Attention, SP and CP", "",
            f"Attention is {percent(at.time_share)} of the busiest rank's block compute time and "
            f"{percent(at.flops_share)} of the model FLOPs at sequence length {at.seq:,}.", "",
            f"- {at.sp}", f"- {at.cp}", ""]
    return "\n".join(out)
