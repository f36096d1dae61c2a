"""`autoplan search` as a user runs it: JSON output, determinism, rules, long context, NVL72, bad input."""
import json

import pytest

import topologies
from autoplan.frontend import trace
from autoplan.mesh import Mesh
from autoplan.search import SearchOptions, search

SMALL = ["gpt:layers=4,hidden=512,heads=8,vocab=1000", "--cluster", "h100x16", "--global-batch", "32"]


def test_json_is_a_ranked_list_of_distinct_meshes_and_byte_identical(cli):
    first = cli("search", *SMALL, "--json", "--top", "3")
    second = cli("search", *SMALL, "--json", "--top", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    plans = json.loads(first.stdout)
    assert 1 <= len(plans) <= 3
    scores = [p["robust"]["score"] for p in plans]          # ranked by the default (robust) objective
    assert scores == sorted(scores)
    meshes = {tuple(p["plan"].split(",")[:5]) for p in plans}
    assert len(meshes) == len(plans)
    for p in plans:
        e = p["estimate"]
        assert e["fits"] and e["violations"] == [] and 0 < e["mfu"] < 1
        assert set(e["memory_breakdown_gib"]) == {"params", "grads", "optimizer", "activations", "other"}


def test_human_output_and_html_report(cli, tmp_path):
    report = tmp_path / "plans.html"
    out = cli("search", *SMALL, "--top", "2", "--report", str(report))
    assert out.returncode == 0, out.stderr
    assert "Top 2 distinct meshes" in out.stdout and "block ILPs" in out.stdout
    html = report.read_text()
    assert html.count("<svg") >= 3 and "http://" not in html.replace("http://www.w3.org", "")


def test_long_context_chooses_context_parallelism_and_shows_why():
    model = trace("llama3-8b", seq=131072)
    result = search(model, topologies.load("h100x256"), global_batch=64, options=SearchOptions(top_k=3))
    best = result.candidates[0]
    assert best.plan.cp > 1
    assert best.estimate.attention_time_share > 0.5      # attention dominates: the reason for CP
    assert all(not c.estimate.violations for c in result.candidates)


def test_nvl72_uses_tensor_parallel_groups_beyond_8_inside_the_rack():
    """GPT-3 175B on one NVL72 rack with 3 sequences per step: data parallelism can use only 3
    ways, so the model needs 24-way model parallelism; TP 12 inside the 72-GPU NVLink domain
    wins.  On 8-GPU NVLink domains the same group would be illegal."""
    model = trace("gpt3-175b", seq=2048)
    cluster = topologies.load("gb200-nvl72")
    best = search(model, cluster, global_batch=3, options=SearchOptions(top_k=2)).candidates[0]
    assert best.plan.tp > 8
    span = cluster.span(Mesh.of(best.plan).group("tp"))
    assert span.level == "nvlink" and not best.estimate.violations


def test_no_plan_fits_names_the_shortfall(cli):
    out = cli("search", "llama3-405b", "--cluster", "h100x8", "--global-batch", "8")
    assert out.returncode == 2
    assert "fits no plan" in out.stderr and "GiB more than" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args, needle", [
    (["--cluster", "h100x7"], "not a whole number of h100 NVLink domains"),
    (["--cluster", "nosuch"], "unknown cluster"),
    (["--cluster", "h100x16", "--top", "0"], "--top must be"),
])
def test_bad_input_is_one_message_and_exit_2(cli, args, needle):
    out = cli("search", SMALL[0], *args)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr
