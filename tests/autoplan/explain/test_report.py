"""The HTML report: self-contained, every chart drawn, loads in headless Chromium without errors."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from autoplan.baselines import baseline
from autoplan.explain import render_report
from autoplan.explain.report import CHART_IDS
from autoplan.explain.svg import GANTT_EXACT_MAX, gantt_svg, map_window, mesh_map_svg
from autoplan.plan import Plan
from costmodels.pipeline import TimelineEntry
from topologies import load

CHROMIUM = "/usr/bin/chromium"
GOOD = "tp=8,pp=8,vpp=2,schedule=zbv,recompute=selective,order=tp-cp-ep-pp-dp"


@pytest.fixture(scope="module")
def report(setup):
    graph, cluster, estimator = setup("gpt3-175b", "h100x1024")
    plan = Plan.parse(GOOD, cluster.num_gpus)
    est = estimator.estimate(plan, 1024)
    bplan = baseline("megascale", graph, cluster, seq=2048, global_batch=1024, estimator=estimator)
    best = estimator.estimate(bplan, 1024)
    html = render_report("gpt3-175b", cluster, [(plan, est), (bplan, best)], estimator, baseline=(bplan, best),
                         baseline_name="megascale")
    return html, plan, est


def test_report_is_self_contained(report):
    html, _, _ = report
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"<link|\bsrc=|@import|url\(", html)
    # the only URL is the SVG namespace, which browsers never fetch
    assert set(re.findall(r"https?://[^\"' <]+", html)) == {"http://www.w3.org/2000/svg"}


def test_report_has_every_section_and_chart(report):
    html, plan, est = report
    for chart in CHART_IDS:
        assert f'id="{chart}"' in html
    for title in ("Summary", "Top plans", "Evidence", "Rule verdicts", "Primitive placement", "Pipeline schedule",
                  "Mesh on the topology", "Step time breakdown", "Memory per GPU", "Attention, SP and CP"):
        assert f"<h2>{title}</h2>" in html
    gantt = html.split('id="gantt"')[1].split("</div>")[0]
    assert gantt.count("<rect") >= 2 * est.microbatches * plan.pp * plan.vpp       # F and B (and W) of every op
    for group in ("tp", "pp", "dp"):                                               # the axes of size > 1
        assert f'data-group="{group}"' in html
    assert "megascale" in html and plan.to_string() in html
    evidence = html.split("<h2>Evidence</h2>")[1].split("<h2>")[0]
    assert "schedule zbv: no timed published run" in evidence          # the chosen plan's flag, in words
    assert "step p10 / p50 / p90" not in html                          # no bands given: none shown


def test_report_shows_the_bands_and_robust_record_of_each_top_plan(setup, report):
    from autoplan.cost.uncertainty import Sampler
    from autoplan.explain.units import percent, seconds
    from autoplan.search.robust import rank

    _, plan, est = report
    graph, cluster, estimator = setup("gpt3-175b", "h100x1024")
    bplan = baseline("megascale", graph, cluster, seq=2048, global_batch=1024, estimator=estimator)
    ranked = [(plan, est), (bplan, estimator.estimate(bplan, 1024))]
    sampler = Sampler(estimator, 4, seed=0)
    bands = [sampler.band(p, 1024, e) for p, e in ranked]
    robust = [r for _, r in sorted(rank(["a", "b"], bands, "regret", 2), key=lambda t: t[0])]
    html = render_report("gpt3-175b", cluster, ranked, estimator, bands=bands, robust=robust)
    top = html.split("<h2>Top plans</h2>")[1].split("<h2>")[0]
    assert "step p10 / p50 / p90" in top and "P(best)" in top and "worst regret" in top
    for b, r in zip(bands, robust):
        assert " / ".join(seconds(b.step(q)) for q in (0.1, 0.5, 0.9)) in top
        assert f"{percent(b.mfu(0.1))} – {percent(b.mfu(0.9))}" in top
        assert f"{r.p_best:.0%}" in top and f"{r.worst_regret:+.1%}" in top
    assert "schedule" in top                                          # the unvalidated column names the regime
    summary = html.split("<h2>Summary</h2>")[1].split("<h2>")[0]
    assert f"{seconds(bands[0].step(0.1))} – {seconds(bands[0].step(0.9))}" in summary


def test_gantt_is_binned_when_huge():
    ops = [TimelineEntry(r, "F" if i % 2 else "B", i, r, i * 1.0, i + 1.0)
           for r in range(4) for i in range(GANTT_EXACT_MAX)]
    svg = gantt_svg(ops, stages=4, chunks=1, width=500)
    assert svg.count("<rect") <= 4 * 500 + 4 + 2 + 4        # per rank at most one rect per pixel column


def test_mesh_map_draws_a_window_of_big_clusters():
    cluster = load("h100x16384")
    assert map_window(cluster) == 1024
    svg = mesh_map_svg(Plan(tp=8, pp=16, dp=128), cluster, "tp")
    assert svg.count("<title>GPU ") == 1024
    nvl = load("gb200-nvl72")
    assert map_window(nvl) == 72
    assert mesh_map_svg(Plan(tp=8, pp=3, dp=3), nvl, "pp").count("<title>GPU ") == 72


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_loads_in_headless_chromium(report, tmp_path):
    html, _, _ = report
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                        "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []                                       # no errors, warnings or logs from the page
    assert 'data-report-ok="1"' in r.stdout                    # the inline check found every chart
    assert r.stdout.count("<svg") >= 5
