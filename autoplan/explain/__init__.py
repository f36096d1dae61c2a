"""Explain and audit a plan: primitive placement, rule verdicts, baseline diff, HTML report.

    from autoplan.explain import Side, audit, render_markdown, render_report
    a = audit(model, cluster, Side("plan", plan, est), Side("megascale", bplan, best))
    print(render_markdown(a))           # or a.to_json()
    html = render_report("gpt3-175b", cluster, [(plan, est)], estimator,
                         baseline=(bplan, best), baseline_name="megascale")

Modules: ``audit`` (the data), ``rules`` (verdicts with evidence), ``markdown``, ``report``
(self-contained HTML) and ``svg`` (its charts), ``units`` (number formatting).
"""
from autoplan.explain.audit import Audit, ClassDiff, Side, audit
from autoplan.explain.markdown import render_markdown
from autoplan.explain.report import render_report
from autoplan.explain.rules import Verdict, verdicts

__all__ = ["Audit", "ClassDiff", "Side", "Verdict", "audit", "render_markdown", "render_report", "verdicts"]
