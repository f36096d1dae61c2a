"""search/driver.py: the best rule-breaking plan (cross-node EP) an MoE search reports beside #1."""
from __future__ import annotations

from autoplan.commands.search import rule_breaking_line
from autoplan.frontend import trace
from autoplan.mesh import Mesh
from autoplan.rules import nvlink_breaks
from autoplan.search import search
from autoplan.search.records import SearchOptions
from autoplan.workload import load_cluster

MOE = "moe:layers=4,hidden=512,heads=8,kv_heads=4,ffn=2048,vocab=8000,experts=16,topk=2,moe_ffn=1024"


def test_the_rule_breaking_plan_is_searched_in_the_searchs_precisions():
    # two 8-GPU NVLink domains, 16 experts: ep=16 puts expert groups across both, ep ≤ 8 does not
    graph, cluster = trace(MOE, seq=1024), load_cluster("h100x16")
    result = search(graph, cluster, global_batch=64, options=SearchOptions(precisions=("fp8",), workers=1))
    best, rb = result.candidates[0].plan, result.rule_breaking
    assert rb is not None and best.precision == "fp8"
    assert rb.plan.precision == "fp8"          # the same plan dimension as #1, not the bf16 default
    breaks = nvlink_breaks(rb.plan, Mesh.of(rb.plan), experts=16, nvlink_domain=cluster.nvlink_domain)
    assert breaks and {g.rule for g, _ in breaks} <= {"ep-inside-nvlink", "etp-inside-nvlink"}
    assert not nvlink_breaks(best, Mesh.of(best), experts=16, nvlink_domain=cluster.nvlink_domain)
    line = rule_breaking_line(graph, result, lifted=False)
    ratio = rb.estimate.step_time_s / result.candidates[0].estimate.step_time_s - 1
    assert rb.plan.to_compact() in line and f"{ratio:+.1%} vs #1" in line
