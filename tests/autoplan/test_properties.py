"""Property-based tests (Hypothesis): random tiny gpt/llama/moe models x clusters (shorthands and
random cluster YAMLs) x plans through the public API, against invariants computed here, not by
the code under test.

Profiles: ``ci`` (default; seeded, derandomized, about a minute) and ``fuzz`` (many more
examples; ``pytest -m fuzz`` selects the longer runs, ``HYPOTHESIS_PROFILE=fuzz`` widens all).
Invariants the cost model once broke keep their failing case as an explicit ``@example``.
"""
from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from autoplan.errors import UserError
from topologies import TopologyError
from topologies.cluster_yaml import from_mapping
from topologies.registry import load as load_cluster

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("fuzz", max_examples=400, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MODELS = (
    "gpt:layers=4,hidden=64,heads=4,vocab=128",
    "llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128",
    "llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96",
    "moe:layers=4,hidden=64,heads=4,kv_heads=2,ffn=64,vocab=128,experts=8,topk=2",
)
SEQ = 64
SHORTHANDS = ("h100x8", "h100x16", "h100x32", "a100x16", "h100x48", "gb200x72")

_GRAPHS: dict[str, object] = {}


def graph_of(model: str):
    from autoplan.frontend import trace

    if model not in _GRAPHS:
        _GRAPHS[model] = trace(model, seq=SEQ)
    return _GRAPHS[model]


@st.composite
def clusters(draw):
    if draw(st.booleans()):
        return load_cluster(draw(st.sampled_from(SHORTHANDS)))
    per_node = draw(st.sampled_from((2, 4, 8)))
    domain = per_node * draw(st.sampled_from((1, 2)))
    raw = {"gpu": draw(st.sampled_from(("h100", "a100", "h200"))), "gpus_per_node": per_node,
           "nvlink_domain": domain, "num_gpus": domain * draw(st.integers(1, 8)),
           "nics_per_node": draw(st.sampled_from((1, 4, 8))),
           "pod_oversubscription": draw(st.sampled_from((1.0, 2.0, 7.0))),
           "launch_latency": draw(st.floats(0, 2e-5)), "nic_efficiency": draw(st.floats(0.5, 1.0))}
    try:
        return from_mapping(raw, default_name="random", source="random")
    except TopologyError:
        assume(False)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plans(draw, num_gpus: int, layers: int, moe: bool):
    from autoplan.plan import Plan

    tp = draw(st.sampled_from(divisors(num_gpus)))
    cp = draw(st.sampled_from(divisors(num_gpus // tp)))
    pp = draw(st.sampled_from([d for d in divisors(num_gpus // (tp * cp)) if d <= layers]))
    dp = num_gpus // (tp * cp * pp)
    ep = draw(st.sampled_from(divisors(dp))) if moe else 1
    vpp = draw(st.sampled_from([v for v in (1, 2) if pp > 1 and layers % (pp * v) == 0] or [1]))
    fields = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp,
              "recompute": draw(st.sampled_from(("none", "selective", "full"))),
              "cp_algo": draw(st.sampled_from(("ring", "ulysses", "usp"))),
              "mbs": draw(st.sampled_from((1, 2))), "zero": draw(st.sampled_from((0, 1, 2, 3))) if dp > 1 else 0}
    if vpp > 1:
        fields["schedule"] = "interleaved"
    try:
        return Plan.from_fields(fields)
    except UserError:
        assume(False)


@st.composite
def cases(draw):
    """(model, graph, cluster, plan, global batch) that the CLI's checks accept."""
    from autoplan.cost import Estimator

    model = draw(st.sampled_from(MODELS))
    graph = graph_of(model)
    cluster = draw(clusters())
    plan = draw(plans(cluster.num_gpus, graph.model.layers, graph.model.experts > 0))
    batch = plan.dp * plan.mbs * draw(st.sampled_from((1, 4, 8)))
    est = Estimator(graph, cluster)
    try:
        e = est.estimate(plan, batch)
    except UserError:
        assume(False)
    return model, graph, cluster, plan, batch, e


# --- independent arithmetic ---------------------------------------------------------

def rank_of(coords: dict[str, int], sizes: list[tuple[str, int]]) -> int:
    rank, stride = 0, 1
    for axis, size in sizes:
        rank += coords[axis] * stride
        stride *= size
    return rank


def axis_groups(plan, axis: str, sub: int | None = None) -> list[list[int]]:
    """Every group of ``axis`` (``sub``: split into consecutive blocks of ``sub`` coordinates)."""
    import itertools

    size = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp // plan.ep, "pp": plan.pp}
    sizes = [(a, size[a]) for a in plan.order]
    others = [a for a, _ in sizes if a != axis]
    out = []
    for rest in itertools.product(*(range(size[a]) for a in others)):
        coords = dict(zip(others, rest))
        members = [rank_of({**coords, axis: i}, sizes) for i in range(size[axis])]
        block = sub or len(members)
        out += [members[k:k + block] for k in range(0, len(members), block)]
    return out


def crosses(group: list[int], domain: int) -> bool:
    return len({r // domain for r in group}) > 1


def per_layer_groups(plan, e, experts: int) -> dict[str, list[list[int]]]:
    out = {}
    if plan.tp > 1:
        out["tp"] = axis_groups(plan, "tp")
    if plan.ep > 1 and experts:
        out["ep"] = axis_groups(plan, "ep")
    if plan.cp > 1 and plan.cp_algo == "ulysses":
        out["cp"] = axis_groups(plan, "cp")
    if plan.cp > 1 and plan.cp_algo == "usp":
        sizes = {p.group_size for p in e.primitives if p.axis == "cp" and p.kind == "all_to_all"}
        if sizes:
            out["cp"] = axis_groups(plan, "cp", sub=max(sizes))
    return out


# --- invariants ---------------------------------------------------------------------

@given(cases())
def test_degrees_memory_mfu_throughput(case):
    _, graph, cluster, plan, batch, e = case
    assert plan.tp * plan.cp * plan.pp * plan.dp == cluster.num_gpus
    assert plan.dp % plan.ep == 0
    assert e.memory_gib > 0 and e.hbm_gib > 0
    assert e.fits == (e.memory_gib <= e.hbm_gib * (1 + 1e-9))
    assert 0 < e.mfu < 1 and 0 < e.hfu < 1
    tokens = batch * graph.seq_len
    assert e.tokens_per_s == pytest.approx(tokens / e.step_time_s, rel=1e-9)
    assert e.tokens_per_s_per_gpu == pytest.approx(e.tokens_per_s / cluster.num_gpus, rel=1e-9)
    assert all(math.isfinite(v) for v in (e.step_time_s, e.memory_gib, e.comm_time_s, e.comm_exposed_s))


@given(cases())
@example(("moe:layers=4,hidden=64,heads=4,kv_heads=2,ffn=64,vocab=128,experts=8,topk=2", "h100x32",
          "pp=2,vpp=2,schedule=dualpipev,ep=8", 64))     # DualPipeV's pairs hide EP time (was 3.5 % over)
def test_breakdown_adds_up_to_the_step(case):
    e = _resolve(case)[-1]
    assert sum(e.time_breakdown_s.values()) == pytest.approx(e.step_time_s, rel=1e-6)
    assert all(v >= 0 for v in e.time_breakdown_s.values())


@given(cases())
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x16", "dp=16,zero=2", 64))
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x16", "tp=2,dp=8,zero=3", 16))
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x16", "pp=4,dp=4,zero=3", 8))
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x32", "pp=4,tp=2,cp=2", 4))
def test_the_table_holds_every_second_the_step_charges(case):
    """What the step charges beyond compute, idle pipeline ranks, the pipeline engine's host time
    and the optimizer (from the step
    and those three, not from the table) is the primitives' exposed seconds: ZeRO-2/3's simulated
    exposure and the sends of a short pipeline's fill and drain included."""
    e = _resolve(case)[-1]
    b = e.time_breakdown_s
    charged = e.step_time_s - b["compute"] - b["pp_bubble"] - b["pp_engine_host"] - b["optimizer"]
    assert sum(p.exposed_s for p in e.primitives) == pytest.approx(charged, rel=1e-9, abs=1e-15)
    dp = e.step_time_s - sum(v for k, v in b.items() if k != "dp_exposed")
    assert sum(p.exposed_s for p in e.primitives if p.axis == "dp") == pytest.approx(dp, rel=1e-6, abs=1e-12)


@given(cases())
def test_every_virtual_stage_holds_a_layer(case):
    _, graph, _, plan, _, e = case
    assert len(e.stage_times_s) == plan.pp * plan.vpp
    if plan.layers:
        assert all(n >= 1 for n in plan.layers) and sum(plan.layers) == graph.model.layers


@given(cases())
def test_same_inputs_same_bytes(case):
    from autoplan.cost import Estimator

    _, graph, cluster, plan, batch, e = case
    assert Estimator(graph, cluster).estimate(plan, batch).to_json() == e.to_json()


def _nvlink_ok(case):
    _, graph, cluster, plan, _, e = case
    rules = {v.rule for v in e.violations}
    for dim, groups in per_layer_groups(plan, e, graph.model.experts).items():
        crossing = [g for g in groups if crosses(g, cluster.nvlink_domain)]
        assert bool(crossing) == (f"{dim}-inside-nvlink" in rules), (dim, crossing[:2], rules)


@given(cases())
def test_nvlink_violations_power_of_two_domains(case):
    """Groups that leave the NVLink domain are flagged (and only those), where every group is
    aligned (group sizes and domains powers of two: rank 0's group tells for all)."""
    _, _, cluster, plan, _, _ = case
    assume(all(x & (x - 1) == 0 for x in (plan.tp, plan.cp, plan.ep, plan.dp, plan.pp, cluster.nvlink_domain)))
    assume(plan.cp_algo != "usp")
    _nvlink_ok(case)


def _case(model: str, cluster: str, plan: str, batch: int):
    from autoplan.cost import Estimator
    from autoplan.plan import Plan

    graph, c = graph_of(model), load_cluster(cluster)
    p = Plan.parse(plan, num_gpus=c.num_gpus)
    return model, graph, c, p, batch, Estimator(graph, c).estimate(p, batch)


@given(cases())
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x48", "tp=6", 8))
def test_nvlink_violations_every_group(case):
    _nvlink_ok(_resolve(case))


def _resolve(case):
    """An explicit ``@example`` (model, cluster, plan string, batch) as a drawn case."""
    return _case(*case) if len(case) == 4 else case


@given(cases())
@example(("llama:layers=6,hidden=96,heads=6,kv_heads=6,ffn=128,vocab=96", "h100x32", "pp=4,tp=2,cp=2", 8))
def test_exposed_at_most_total(case):
    e = _resolve(case)[-1]
    for p in e.primitives:
        assert p.exposed_s <= p.time_s * (1 + 1e-9) + 1e-15, p
    assert sum(p.exposed_s for p in e.primitives) <= sum(p.time_s for p in e.primitives) * (1 + 1e-9) + 1e-15
    assert e.comm_exposed_s <= e.comm_time_s * (1 + 1e-9) + 1e-15


@pytest.mark.fuzz
@settings(max_examples=300)
@given(cases())
def test_fuzz_all_invariants_that_hold(case):
    """The longer run (``-m fuzz``): every invariant without a known bug, on many more cases."""
    test_degrees_memory_mfu_throughput.hypothesis.inner_test(case)
    test_breakdown_adds_up_to_the_step.hypothesis.inner_test(case)
    test_every_virtual_stage_holds_a_layer.hypothesis.inner_test(case)
    test_exposed_at_most_total.hypothesis.inner_test(case)
    test_the_table_holds_every_second_the_step_charges.hypothesis.inner_test(case)


def test_zero_layer_virtual_stage_rejected():
    from autoplan.plan import Plan

    with pytest.raises(UserError, match="no layer"):
        Plan.parse("pp=2,vpp=2,layers=0-0-1-3,schedule=interleaved", num_gpus=8)


# --- search, explain, export through the CLI --------------------------------------

def _cli_json(capsys, *argv) -> object:
    from autoplan.cli import main

    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


SEARCH_CASES = [(MODELS[0], "h100x16", 128), (MODELS[3], "h100x16", 64), (MODELS[1], "h100x32", 256)]


@pytest.fixture(scope="module")
def searched():
    import contextlib
    import io

    from autoplan.cli import main

    out = {}
    for model, cluster, batch in SEARCH_CASES:
        buf = io.StringIO()
        argv = ["search", model, "--cluster", cluster, "--seq", str(SEQ), "--global-batch", str(batch),
                "--top", "3", "--json", "--workers", "1"]
        with contextlib.redirect_stdout(buf):
            assert main(argv) == 0
        out[(model, cluster, batch)] = (argv, buf.getvalue())
    return out


@pytest.mark.parametrize("key", SEARCH_CASES)
def test_search_same_bytes_and_valid_plans(searched, capsys, key):
    from autoplan.cli import main

    argv, first = searched[key]
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    for c in json.loads(first):
        est = c["estimate"]
        p = _plan(c)
        assert p.tp * p.cp * p.pp * p.dp == load_cluster(key[1]).num_gpus
        assert est["violations"] == [] and est["fits"] and 0 < est["mfu"] < 1


@pytest.mark.parametrize("key", SEARCH_CASES)
def test_search_estimate_equals_estimate_of_its_plan(searched, capsys, key):
    """Every field, ilp_gap included, equals `autoplan estimate` of the same plan (the issue's
    ilp_gap disagreements did not reproduce on these small cases: no xfail)."""
    model, cluster, batch = key
    for c in json.loads(searched[key][1]):
        again = _cli_json(capsys, "estimate", model, "--cluster", cluster, "--seq", str(SEQ), "--global-batch",
                          str(batch), "--plan", _plan(c).to_string(), "--json")
        assert json.dumps(again, sort_keys=True) == json.dumps(c["estimate"], sort_keys=True)


def _plan(c: dict):
    from autoplan.plan import Plan

    return Plan.parse(c["plan"]) if isinstance(c["plan"], str) else Plan.from_fields(c["plan"])


@pytest.mark.parametrize("key", SEARCH_CASES)
def test_explain_and_export_read_search_output(searched, capsys, tmp_path, key):
    model, cluster, batch = key
    path = tmp_path / "plans.json"
    path.write_text(searched[key][1])
    best = json.loads(searched[key][1])[0]
    audit = _cli_json(capsys, "explain", str(path), "--model", model, "--cluster", cluster, "--format", "json")
    assert json.dumps(audit, sort_keys=True) == json.dumps(
        _cli_json(capsys, "explain", str(path), "--model", model, "--cluster", cluster, "--format", "json"),
        sort_keys=True)
    exported = _cli_json(capsys, "export", str(path), "--to", "json", "--model", model)
    assert _plan({"plan": exported.get("plan", exported)}).tp == _plan(best).tp
