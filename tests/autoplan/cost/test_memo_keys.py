"""The cache-key test (issue 33): every cached quantity keys on every input it reads.

On one warm Estimator (its tables and every module memo filled by pricing a base plan through
every entry point: estimate, step time, memory, layout, the search's memos, bounds and cuts, a
band),
the base plan with each Plan field changed in turn, then each workload input (global batch,
sequence length, cluster, every ``EstimateOptions`` field), is priced under
``costmodels.memo.audit()``: every memo hit is recomputed and compared with what it returned.
A key that misses an input the value reads returns the base plan's value for a variant that
differs in that input, and the audit raises ``StaleHit``.  The variants are listed per field of
``Plan`` and ``EstimateOptions``: a new field without a variant fails the test.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import topologies
from autoplan.cost import EstimateOptions, Estimator, bounds
from autoplan.cost.context import PlanContext
from autoplan.cost.evidence import flags
from autoplan.cost.params import Params
from autoplan.cost.uncertainty import Sampler
from autoplan.frontend import trace
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.search import stages
from costmodels import memo

MODEL = "moe:layers=8,hidden=64,heads=4,kv_heads=2,vocab=128,experts=4,topk=2,moe_ffn=64,dense_layers=1"
SEQ, BATCH, CLUSTER = 256, 64, "h100x32"
BASE = Plan(tp=2, pp=2, dp=4, cp=2, ep=2, vpp=2, mbs=1, schedule="interleaved", recompute=("none",),
            sp=True, zero=1, cp_algo="ring", order=("tp", "cp", "ep", "dp", "pp"))
PLAN_VARIANTS = {                  # per Plan field, valid plans differing from BASE in it, priced in order
    "tp": [dict(tp=4, dp=2)],
    "pp": [dict(pp=4, dp=2)],
    "dp": [dict(dp=8, cp=1)],
    "cp": [dict(cp=4, dp=2)],
    "ep": [dict(ep=4)],
    "vpp": [dict(vpp=4)],
    "mbs": [dict(mbs=2)],
    # zbv moves the stages (V placement); 1f1b then zb-h1 keep the placement, stages and layers
    "schedule": [dict(schedule="zbv"), dict(schedule="1f1b", vpp=1), dict(schedule="zb-h1", vpp=1)],
    "recompute": [dict(recompute=("selective",)), dict(recompute=("full", "selective"))],
    "layers": [dict(layers=(1, 3, 3, 1))],
    "sp": [dict(sp=False)],
    "zero": [dict(zero=3)],
    "cp_algo": [dict(cp_algo="ulysses"), dict(cp_algo="usp")],
    "ulysses": [dict(cp_algo="usp", ulysses=1), dict(cp_algo="usp", ulysses=2)],     # USP's split: ring 2, Ulysses 2
    "order": [dict(order=("tp", "dp", "cp", "ep", "pp"))],
    "precision": [dict(precision="fp8"), dict(precision="fp8-rowwise"), dict(precision="fp8-delayed")],
    # folded: etp=2 keeps BASE's ep groups' size but not their ranks; etp=1 the expert shards and edp
    "etp": [dict(etp=2), dict(etp=1), dict(etp=1, ep=4)],
    "dispatcher": [dict(dispatcher="deepep")],
    "ep_overlap": [dict(ep_overlap=True)],
}
OPTION_VARIANTS = {                # per EstimateOptions field, another value (profile: a changed copy)
    "overlap_grad_reduce": False,
    "allow_cross_domain": True,
    "profile": None,
    "solver": "cbc",
    "time_limit_s": 5.0,
    "fsdp_prefetch": 2,
    "fsdp_reshard_after_forward": True,
    "fsdp_grad_sync": "step",
    "memory_margin_gib": 8.0,
    "grad_reduce_bytes": 2.0,
    "state_precision": "apex-dfa-bf16",
    "kernels": "megatron-core",
    "attention_kernel": "fa2",
    "loss_kernel": "fused",
    "fp8_engine": "torchao",
    "fp8_recompute": "bf16",
    "fp8_params": True,
    "tp_comm_overlap": True,
    "post_validation": True,
    "wgrad_store": True,
    "params": Params(gemm_peak=0.9, nic_efficiency=0.8, wpass=1.2, recompute=1.1, cp_overlap=0.7, fp8_gemm_peak=0.9),
    "exact": True,
}
FP8_OPTIONS = ("fp8_engine", "fp8_params", "params")   # read by FP8 plans only (params: fp8_gemm_peak):
                                                       # priced at BASE in FP8 too
FP8_RECOMPUTE_OPTIONS = ("fp8_recompute",)   # read by FP8 plans that recompute: priced so too
# memos the scenario below cannot reach, and why
UNREACHED = {
    "ilp.skeletons": "the LP relaxation certifies every block ILP this small: CP-SAT builds no model "
                     "(tests/autoplan/sharding/test_model_reuse.py checks its skeletons)",
}


def _price_all(est: Estimator, plan: Plan, batch: int, sampler: Sampler | None = None) -> list:
    """``plan`` through every entry point that reads a memo."""
    e = est.estimate(plan, batch)
    out = [e, est.step_time_s(plan, batch), est.memory_by_rank(plan, batch), est.layout(plan),
           stages._estimate(est, plan, batch), stages._step_time(est, plan, batch),
           stages.memoised_memory(est, plan, batch), stages.memoised_floor(est, plan, batch),
           bounds.step_lower_bound(est, plan, batch), bounds.states_lower_bound(est, plan, batch),
           stages._cut_variants(est, plan.replace(schedule="1f1b", vpp=1, layers=(), ep_overlap=False)),
           flags(plan, e, moe=True)]
    if sampler is not None:
        out.append(sampler.steps([plan], batch, range(2)))
    return out


@contextmanager
def _variant(name: str, seen: Counter[str]) -> Iterator[None]:
    """One audit for one changed input, its hits added to ``seen``; a stale hit names the input."""
    try:
        with memo.audit() as record:
            yield
    except memo.StaleHit as err:
        raise memo.StaleHit(f"{name}: {err}") from None
    seen.update(record.hits)


def test_every_plan_field_and_option_has_a_variant():
    assert set(PLAN_VARIANTS) == {f.name for f in dataclasses.fields(Plan)}
    assert set(OPTION_VARIANTS) == {f.name for f in dataclasses.fields(EstimateOptions)}


def test_every_input_reaches_every_memo_that_reads_it(profile_with):
    """Each Plan field, then each workload input, changed in turn on one warm Estimator and its
    module memos, every hit recomputed; every memo of the cost model, the search and the ILP is
    checked at least once (but those in ``UNREACHED``)."""
    memo.clear_all()
    model, cluster = trace(MODEL, seq=SEQ), topologies.load(CLUSTER)
    est = Estimator(model, cluster)
    sampler = Sampler(est, samples=2, seed=0)
    _price_all(est, BASE, BATCH, sampler)
    path, _ = profile_with("h100", overhead_s=6.0e-06, gemm_peak_fraction=0.6)
    options = {name: EstimateOptions(**{name: path if name == "profile" else value})
               for name, value in OPTION_VARIANTS.items()}
    seen: Counter[str] = Counter()
    for field, changes in PLAN_VARIANTS.items():
        for change in changes:
            plan = BASE.replace(**change)
            assert getattr(plan, field) != getattr(BASE, field)
            with _variant(f"plan {change}", seen):
                _price_all(est, plan, BATCH, sampler)
    with _variant("the base plan again", seen):                # every plan-keyed memo hit once
        _price_all(est, BASE, BATCH, sampler)
    with _variant("global batch", seen):
        _price_all(est, BASE, 2 * BATCH, Sampler(est, samples=2, seed=0))
    with _variant("sequence length", seen):
        _price_all(Estimator(trace(MODEL, seq=2 * SEQ), cluster), BASE, BATCH)
    with _variant("cluster", seen):
        _price_all(Estimator(model, topologies.load("a100x32")), BASE, BATCH)
    for name, opts in options.items():
        with _variant(f"option {name}", seen):
            priced = Estimator(model, cluster, opts)
            _price_all(priced, BASE, BATCH)
            if name in FP8_OPTIONS:
                _price_all(priced, BASE.replace(precision="fp8"), BATCH)
            if name in FP8_RECOMPUTE_OPTIONS:
                _price_all(priced, BASE.replace(precision="fp8", recompute=("full",)), BATCH)
    names = {n.removeprefix("table:") for n in memo.REGISTRY
             if n.startswith(("table:", "costmodels.", "autoplan.cost", "autoplan.search", "autoplan.sharding"))
             and not n.startswith("table:test.")}
    assert names - set(seen) - set(UNREACHED) == set()


def test_a_plan_context_is_never_a_memo_key():
    """The pricers' ``PlanContext`` holds the whole plan and the Estimator's objects: a memo keyed
    on it would bypass the plan's projections (``cost.memo``), so it cannot be hashed."""
    est = Estimator(trace(MODEL, seq=SEQ), topologies.load(CLUSTER))
    ctx = est.context(BASE, Mesh.of(BASE))
    assert isinstance(ctx, PlanContext) and ctx.plan is BASE
    with pytest.raises(TypeError):
        hash(ctx)
