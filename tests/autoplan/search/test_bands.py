"""Uncertainty bands and robust ranking (issue 13): ranges as data, paired seeded samples, exact
re-pricing of each sample, p10 ≤ p50 ≤ p90 through the CLI, objectives, folding, overrides."""
import json

import pytest

from autoplan.cost import EstimateOptions, Estimator
from autoplan.cost.params import PARAM_NAMES, Params, ranges
from autoplan.cost.uncertainty import DEFAULT_SAMPLES, Band, Sampler, draw, quantile
from autoplan.plan import Plan
from autoplan.search import SearchOptions, search
from autoplan.search.robust import rank

MODEL = "gpt:layers=4,hidden=1024,heads=16,vocab=32000"
SMALL = ["gpt:layers=4,hidden=512,heads=8,vocab=1000", "--cluster", "h100x16", "--global-batch", "32"]
PLAN = "tp=4,pp=2,dp=2,mbs=1,schedule=zb-h1,recompute=selective,zero=1"


def test_every_parameter_has_a_range_around_the_point_with_a_source():
    rs = ranges("h100")
    assert tuple(r.name for r in rs) == PARAM_NAMES
    for r in rs:
        assert r.low <= 1.0 <= r.high and r.low < r.high and r.source
    by = {r.name: r for r in rs}
    assert "nemotron" in by["gemm_peak"].source.lower()    # the H100 profile's residual-based range
    assert by["gemm_peak"] != {r.name: r for r in ranges("a100")}["gemm_peak"]
    assert "nccl-tests" in by["nic_efficiency"].source and by["nic_efficiency"].low == 0.8   # network.yaml's


def test_ranges_cover_the_out_of_sample_spread_and_are_centred_on_the_point():
    import yaml

    from autoplan.cost.params import OUT_OF_SAMPLE_PATH, SHARES
    with open(OUT_OF_SAMPLE_PATH) as f:
        written = yaml.safe_load(f)["ranges"]
    for gpu, profile in (("h100", "h100"), ("a100", "a100"), ("h200", "h100")):
        by = {r.name: r for r in ranges(gpu)}
        for name, wide in {**written["any"], **written.get(profile, {})}.items():
            assert by[name].low <= wide["low"] and by[name].high >= wide["high"], (gpu, name)
        for r in by.values():
            d = 1.0 - r.low
            assert r.high == pytest.approx(1.0 if r.name in SHARES else 1.0 + d), r.name
    assert "out-of-sample" in {r.name: r for r in ranges("h100")}["gemm_peak"].source    # it widened
    # a split W pass is sampled cheaper as well as dearer than priced (the prior says 1.0-1.2)
    assert {r.name: (r.low, r.high) for r in ranges("h100")}["wpass"] == pytest.approx((0.8, 1.2))


def test_samples_are_seeded_latin_hypercube_inside_the_ranges():
    rs = ranges("h100")
    a, b, c = draw(rs, 16, 0), draw(rs, 16, 0), draw(rs, 16, 1)
    assert a == b and a != c
    for r in rs:
        values = sorted(getattr(p, r.name) for p in a)
        for i, v in enumerate(values):                      # one sample per stratum
            width = (r.high - r.low) / 16
            assert r.low + i * width <= v <= r.low + (i + 1) * width


def test_each_sample_is_the_point_estimate_under_that_samples_parameters(setup):
    """The re-pricing of only the parametric parts (symbolic layout prices) is exact."""
    graph, cluster, _ = setup(MODEL, "h100x16")
    point = Estimator(graph, cluster)
    plan = Plan.parse(PLAN, num_gpus=16)
    e = point.estimate(plan, 32)
    sampler = Sampler(point, 6, seed=3)
    band = sampler.band(plan, 32, e)
    for p, t in zip(sampler.params, band.step_s):
        direct = Estimator(graph, cluster, EstimateOptions(params=p)).estimate(plan, 32).step_time_s
        assert t == pytest.approx(direct, rel=1e-12)
    assert len(set(band.step_s)) == 6                        # the parameters reach the step time


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_estimate_cli_band_fields_ordered_paired_and_byte_identical(cli):
    args = ("estimate", MODEL, "--cluster", "h100x16", "--plan", PLAN, "--global-batch", "32", "--json")
    first, second = cli(*args), cli(*args, fresh=True)       # a second interpreter: its own hash seed
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    e = json.loads(first.stdout)
    none = json.loads(cli(*args, "--samples", "0").stdout)
    assert e["step_time_s"] == none["step_time_s"] and "step_time_s_p50" not in none
    assert e["step_time_s_p10"] <= e["step_time_s_p50"] <= e["step_time_s_p90"]
    assert e["step_time_s_p10"] < e["step_time_s_p90"]
    assert e["mfu_p10"] <= e["mfu_p50"] <= e["mfu_p90"]
    assert e["mfu_p10"] == pytest.approx(e["mfu"] * e["step_time_s"] / e["step_time_s_p90"], rel=1e-4)
    assert e["band_samples"] == DEFAULT_SAMPLES
    table = cli(*args[:-1])
    assert "step p10/p50/p90" in table.stdout and f"{e['step_time_s_p50']:.3f}" in table.stdout


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_params_override_slows_the_network_and_bad_files_exit_2(cli, tmp_path):
    slow = tmp_path / "nic.yaml"
    slow.write_text("nic_efficiency: 0.5\n")
    args = ("estimate", MODEL, "--cluster", "h100x16", "--plan", "tp=8,dp=2,mbs=1,zero=3", "--global-batch", "32",
            "--json", "--samples", "0")
    base = json.loads(cli(*args).stdout)
    slowed = json.loads(cli(*args, "--params", str(slow)).stdout)
    dp = [p for p in base["primitives"] if p["axis"] == "dp"]
    dp_slow = [p for p in slowed["primitives"] if p["axis"] == "dp"]
    assert dp and all(b["time_s"] > a["time_s"] * 1.5 for a, b in zip(dp, dp_slow))
    bad = tmp_path / "bad.yaml"
    bad.write_text("nic_eficiency: 0.8\n")
    out = cli(*args, "--params", str(bad))
    assert out.returncode == 2 and "nic_eficiency" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def _band(*steps):
    return Band(tuple(steps), steps[0], 0.5)


def test_objective_changes_the_ranking_in_a_constructed_case():
    """A is fastest at the point and on most samples but collapses on one; B is steady."""
    a = Band((1.00, 1.00, 1.00, 1.60), 0.95, 0.5)
    b = Band((1.05, 1.05, 1.05, 1.10), 1.00, 0.5)
    keys, bands = ["A", "B"], [a, b]
    assert [i for i, _ in rank(keys, bands, "point", 2)] == [0, 1]
    assert [i for i, _ in rank(keys, bands, "p50", 2)] == [0, 1]
    assert [i for i, _ in rank(keys, bands, "p90", 2)] == [1, 0]
    picked = rank(keys, bands, "regret", 2)
    assert [i for i, _ in picked] == [1, 0]
    rb, ra = picked[0][1], picked[1][1]
    assert rb.score == pytest.approx(0.05) and ra.score == pytest.approx(1.6 / 1.1 - 1)
    assert ra.p_best == 0.75 and rb.p_best == 0.25
    assert rb.worst_regret == pytest.approx(0.05)


def test_worst_regret_is_taken_against_the_pool_the_ranking_uses():
    """C is not returned (top 2) but beats B on the third sample: B's worst regret counts it, so
    the returned plans are in the order of their worst regret (against the two returned alone,
    A would show 4 % above B's 3 %)."""
    a, b, c = _band(1.04, 1.00, 1.00), _band(1.00, 1.02, 1.03), _band(1.30, 1.30, 0.96)
    picked = rank(["A", "B", "C"], [a, b, c], "regret", 2)
    assert [i for i, _ in picked] == [0, 1]
    worst = [r.worst_regret for _, r in picked]
    assert worst == [r.score for _, r in picked] == sorted(worst)
    assert worst == pytest.approx([1.0 / 0.96 - 1.0, 1.03 / 0.96 - 1.0])
    assert [r.p_best for _, r in picked] == pytest.approx([2 / 3, 1 / 3])     # of the returned set
    # another objective ranks by its own score; the worst regret stays against the pool
    p50 = rank(["A", "B", "C"], [a, b, c], "p50", 3)
    assert [r.worst_regret for _, r in p50] == pytest.approx([1.0 / 0.96 - 1.0, 1.03 / 0.96 - 1.0, 0.3])


def test_near_duplicates_fold_and_one_variant_per_mesh():
    a, twin, other = _band(1.0, 2.0, 3.0), _band(1.001, 2.002, 2.999), _band(1.1, 1.9, 3.3)
    picked = rank(["a", "twin", "other"], [a, twin, other], "p50", 3)
    # p50: other 1.9 < a 2.0 < twin 2.002; twin stays within 0.5 % of a on every sample
    assert [i for i, _ in picked] == [2, 0] and picked[1][1].folded == ("twin",) and picked[0][1].folded == ()
    assert [i for i, _ in rank(["a", "twin", "other"], [a, twin, other], "point", 3)] == [0, 1, 2]
    # p90: twin 2.7996 < a 2.8 < other 3.02; a folds into twin, which answers a's mesh m1 too
    grouped = rank(["a", "other", "twin"], [a, other, twin], "p90", 3, groups=["m1", "m1", "m2"])
    assert [i for i, _ in grouped] == [2] and grouped[0][1].folded == ("a",)
    same_mesh = rank(["a", "other"], [a, other], "p90", 3, groups=["m1", "m1"])
    assert [i for i, _ in same_mesh] == [0]


def test_quantile_interpolates_order_statistics():
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0], 0.1) == pytest.approx(1.1)


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_search_point_objective_is_the_unbanded_ranking_and_default_reports_robust_fields(cli):
    point = json.loads(cli("search", *SMALL, "--json", "--top", "3", "--objective", "point").stdout)
    unbanded = json.loads(cli("search", *SMALL, "--json", "--top", "3", "--samples", "0",
                              "--objective", "point").stdout)
    assert [p["plan"] for p in point] == [p["plan"] for p in unbanded]
    steps = [p["estimate"]["step_time_s"] for p in point]
    assert steps == [p["estimate"]["step_time_s"] for p in unbanded] == sorted(steps)   # the point ranking
    assert all(p["robust"]["objective"] == "point" and p["robust"]["folded"] == [] for p in point)
    assert all("robust" not in p for p in unbanded)
    first = cli("search", *SMALL, "--json", "--top", "3")
    assert first.stdout == cli("search", *SMALL, "--json", "--top", "3", fresh=True).stdout
    plans = json.loads(first.stdout)
    assert sum(p["robust"]["p_best"] for p in plans) == pytest.approx(1.0)
    scores = [p["robust"]["score"] for p in plans]
    assert scores == sorted(scores) and all(p["robust"]["objective"] == "regret" for p in plans)
    for p in plans:
        e = p["estimate"]
        assert e["step_time_s_p10"] <= e["step_time_s_p50"] <= e["step_time_s_p90"]
        assert p["robust"]["worst_regret"] >= 0


def test_search_objectives_share_paired_samples(traced):
    import topologies
    graph = traced("gpt:layers=4,hidden=512,heads=8,vocab=1000", seq=2048)
    cluster = topologies.load("h100x16")
    runs = {o: search(graph, cluster, global_batch=32, options=SearchOptions(top_k=3, objective=o, workers=1))
            for o in ("point", "p90")}
    bands = {c.plan.to_string(): c.band.step_s for r in runs.values() for c in r.candidates}
    for _o, r in runs.items():                    # the same plan has the same samples in both runs
        for c in r.candidates:
            assert bands[c.plan.to_string()] == c.band.step_s
    p90 = [c.band.step(0.9) for c in runs["p90"].candidates]
    assert p90 == sorted(p90)
    with pytest.raises(Exception, match="needs parameter samples"):
        SearchOptions(objective="p90", samples=0)
    assert Params().nominal


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_evidence_flags_in_estimate_json_and_explain(cli):
    zbv = PLAN.replace("schedule=zb-h1", "schedule=zbv")
    e = json.loads(cli("estimate", MODEL, "--cluster", "h100x16", "--plan", zbv, "--global-batch", "32", "--json",
                       "--samples", "0").stdout)
    regimes = {f["regime"] for f in e["evidence"]}
    assert "schedule" in regimes and "zero" not in regimes and "cp" not in regimes     # zbv: never validated
    for validated_plan in ("tp=4,pp=2,dp=2,vpp=2,mbs=1,schedule=interleaved,zero=1", PLAN):   # zb-h1: ZB paper
        validated = json.loads(cli("estimate", MODEL, "--cluster", "h100x16", "--plan", validated_plan,
                                   "--global-batch", "32", "--json", "--samples", "0").stdout)
        assert {f["regime"] for f in validated["evidence"]} <= {"mfu"}
    md = cli("explain", zbv, "--model", MODEL, "--cluster", "h100x16", "--global-batch", "32")
    assert md.returncode == 0, md.stderr
    assert "## Evidence: plan" in md.stdout and "schedule zbv: no timed published run" in md.stdout


def test_bench_band_of_auto_against_hand_is_paired(setup):
    from autoplan.bench.case import _bands
    graph, cluster, est = setup(MODEL, "h100x16")
    rows = {"auto": {"status": "ok", "fits": True, "respects_nvlink": True, "plan": PLAN},
            "megatron": {"status": "ok", "fits": True, "respects_nvlink": True,
                         "plan": "tp=8,pp=2,vpp=2,mbs=1,schedule=interleaved,recompute=selective"}}
    b = _bands(est, rows, "megatron", 32, 16)
    assert b["auto_vs_hand_p10"] <= b["auto_vs_hand_p50"] <= b["auto_vs_hand_p90"]
    assert 0.0 <= b["p_auto_beats_hand"] <= 1.0
    same = _bands(est, {"auto": rows["auto"], "self": rows["auto"]}, "self", 32, 16)
    assert same["auto_vs_hand_p10"] == same["auto_vs_hand_p90"] == 1.0 and same["p_auto_beats_hand"] == 0.0
    assert _bands(est, rows, None, 32, 16)["p_auto_beats_hand"] is None
