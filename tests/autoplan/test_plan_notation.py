"""The compact plan notation round-trips through ``Plan.parse``; plan strings forgive what has no
meaning (``order`` without degree-1 axes; a gpt spec's ``max_seq`` from ``--seq``)."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.errors import UserError
from autoplan.plan import AXES, CP_ALGOS, PRECISIONS, RECOMPUTE, SCHEDULES, Plan

_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plans(draw):
    deg = st.sampled_from((1, 2, 4, 8))
    tp, cp, pp, dp = draw(deg), draw(deg), draw(deg), draw(deg)
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if dp % e == 0]))
    schedule = draw(st.sampled_from(SCHEDULES if pp > 1 else ("1f1b", "gpipe")))
    vpp = 2 if schedule in ("zbv", "dualpipev") else (draw(st.sampled_from((2, 3))) if schedule == "interleaved" else 1)
    recompute = draw(st.sampled_from([(r,) for r in RECOMPUTE]
                                     + [tuple(draw(st.sampled_from(RECOMPUTE)) for _ in range(pp))]))
    layers = draw(st.sampled_from([(), tuple(range(1, pp * vpp + 1))])
                  | st.lists(st.integers(1, 3), min_size=pp * vpp, max_size=pp * vpp).map(tuple))
    return Plan(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, vpp=vpp, mbs=draw(st.sampled_from((1, 2, 4))), schedule=schedule,
                recompute=recompute, layers=layers, sp=draw(st.booleans()), zero=draw(st.integers(0, 3)),
                cp_algo=draw(st.sampled_from(CP_ALGOS)), order=draw(st.permutations(AXES)),
                precision=draw(st.sampled_from(PRECISIONS)))


@_SETTINGS
@given(plans())
def test_compact_notation_round_trips(plan):
    text = plan.to_compact()
    assert "," not in text and "schedule=" not in text
    assert Plan.parse(text) == plan
    assert Plan.parse(text, num_gpus=plan.num_gpus) == plan
    assert Plan.parse(plan.to_string()) == plan


def test_uneven_layers_print_as_runs_and_read_back():
    layers = (4,) * 16 + (2,) * 16
    plan = Plan(tp=2, pp=16, dp=32, vpp=2, schedule="zbv", layers=layers)
    assert plan.to_compact() == "tp2·pp16·dp32 zero1 mbs1 zbv layers=4x16-2x16"
    assert Plan.parse("tp=2,pp=16,dp=32,schedule=zbv,layers=4x16-2x16").layers == layers
    assert Plan.parse("pp=4,layers=1-3x2-1").layers == (1, 3, 3, 1)
    assert plan.to_string().count("layers=4-4-") == 1           # the canonical string keeps every stage
    with pytest.raises(UserError, match="NxK"):
        Plan.parse("pp=2,layers=4y2")


def test_compact_notation_says_only_what_is_not_a_default():
    plan = Plan.parse("tp=2,pp=8,dp=32,cp=2,ep=1,vpp=2,mbs=2,schedule=zbv,recompute=none,sp=on,zero=2,"
                      "cp_algo=ulysses,order=tp-cp-ep-dp-pp")
    assert plan.to_compact() == "tp2·cp2·pp8·dp32 zero2 mbs2 zbv ulysses"
    assert plan.compact_tokens() == ("tp2", "cp2", "pp8", "dp32", "zero2", "mbs2", "zbv", "ulysses")
    megascale = Plan.parse("tp=8,pp=8,vpp=3,recompute=selective,order=tp-cp-ep-pp-dp", num_gpus=1024)
    assert megascale.to_compact() == "tp8·pp8·dp16 zero1 mbs1 interleaved vpp3 rc=selective order=tp-pp-dp"
    assert Plan.parse("tp=1", num_gpus=1).to_compact() == "dp1 mbs1"
    # ASCII '.' for '·', dp from the GPU count
    assert Plan.parse("tp2.pp8 mbs2 zbv", num_gpus=64) == Plan(tp=2, pp=8, dp=4, mbs=2, schedule="zbv")


def test_order_may_omit_axes_of_degree_one():
    """A dense model has no ep axis to place: tp-cp-pp-dp is its whole order."""
    dense = Plan.parse("tp=8,pp=4,order=tp-cp-pp-dp", num_gpus=64)
    assert dense.order == ("tp", "cp", "ep", "pp", "dp")           # ep keeps its default place
    assert Plan.parse("tp=8,pp=4,order=tp-pp-dp", num_gpus=64).order == dense.order
    assert Plan.parse("tp=8,pp=4,order=tp-dp-pp", num_gpus=64).order == ("tp", "cp", "ep", "dp", "pp")
    plan = {"tp": 2, "pp": 2, "dp": 2, "order": ["pp", "tp", "dp"]}
    assert Plan.from_json({"schema_version": 1, "plan": plan}).order == ("pp", "cp", "ep", "tp", "dp")
    with pytest.raises(UserError, match=r"leaves out dp \(degree 16\)"):
        Plan.parse("tp=8,pp=8,order=tp-cp-ep-pp", num_gpus=1024)


def test_every_order_of_the_axes_that_matter_is_one_plan():
    """Leaving degree-1 axes out is unambiguous: each order of the degree > 1 axes gives one plan."""
    orders = {Plan.parse(f"tp=2,pp=2,order={'-'.join(o)}", num_gpus=8).order
              for o in itertools.permutations(("tp", "pp", "dp"))}
    assert len(orders) == 6


def test_gpt_spec_takes_max_seq_from_seq():
    from autoplan.frontend.source import load_source
    from autoplan.zoo.spec import parse_spec

    spec = "gpt:layers=2,hidden=64,heads=4,vocab=128"
    assert parse_spec(spec).max_seq == 2048                     # the default when the run is shorter
    assert parse_spec(spec, seq=4096).max_seq == 4096
    assert parse_spec(spec + ",max_seq=8192", seq=4096).max_seq == 8192
    assert load_source(spec, 4096).max_seq == 4096
    assert load_source(spec, 4096).fingerprint != load_source(spec).fingerprint


def test_gpt_spec_traces_at_a_seq_beyond_its_default_max_seq(traced):
    g = traced("gpt:layers=2,hidden=64,heads=4,vocab=128", seq=4096)
    assert g.seq_len == 4096
    wpe = [n for n in g.pre.params() if tuple(n.out.shape) == (4096, 64)]
    assert len(wpe) == 1                                         # learned positions for all 4,096


def test_readme_examples_of_the_notation_are_right():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("tp2·cp2·pp8·dp32") and " = " in line)
    compact, canonical = (s.strip() for s in line.split(" = "))
    assert Plan.parse(compact) == Plan.parse(canonical) and Plan.parse(canonical).to_compact() == compact
    other = next(line for line in readme.splitlines() if line.startswith("tp8·pp8·dp16 zero1"))
    assert Plan.parse(other, num_gpus=1024).to_compact() == other
