"""Search results against memcheck (issue 12): experiments/check_search_memory.py."""
import pytest

SMALL = "llama:layers=4,hidden=1024,heads=8,kv_heads=4,ffn=2816,vocab=8192"


def _row(csm, **kw):
    base = dict(case="m c s1 b1", source="top-5 #1", plan="dp=8", search_gib=70.0, limit_gib=75.65,
                hbm_gib=79.65, margin_gib=4.0)
    return csm.Row(**{**base, **kw})


def test_table_and_exit_status_mark_a_peak_over_hbm_minus_margin(experiment):
    csm = experiment("check_search_memory")
    ok = _row(csm, estimate_gib=70.0, tracker_gib=69.0)
    over = _row(csm, plan="tp=2,dp=4", estimate_gib=74.0, tracker_gib=76.0)
    skipped = _row(csm, plan="cp=2,dp=4", skipped="cp=2: context parallelism's exchange reads token positions")
    assert csm.verdict([ok, skipped]) == 0 and csm.verdict([ok, over, skipped]) == 1
    assert ok.fits and over.fits is False and skipped.fits is None
    assert ok.error == pytest.approx(70 / 69 - 1) and over.error == pytest.approx(74 / 76 - 1)
    s = csm.summary([ok, over, skipped])
    assert (s["plans"], s["plans_checked"], s["over_limit"]) == (3, 2, 1)
    assert s["max_tracker_over_limit"] == pytest.approx(76 / 75.65)
    assert s["max_abs_error"] == pytest.approx(abs(74 / 76 - 1))
    lines = csm.markdown([ok, over, skipped]).splitlines()
    assert "| 69.00 |" in lines[2] and "| yes | +1.4% |" in lines[2]
    assert "**no**" in lines[3] and "-2.6%" in lines[3]
    assert "not run: cp=2" in lines[4]
    assert "over the limit: 1." in lines[-1]


def test_a_plan_memcheck_cannot_run_is_a_row_with_its_reason(experiment):
    """The search's numbers and memcheck's reason, without running anything (cp > 1 under FSDP)."""
    from types import SimpleNamespace

    from autoplan.cost import EstimateOptions
    from autoplan.plan import Plan
    from autoplan.workload import Workload

    csm = experiment("check_search_memory")
    case = csm.Case(SMALL, "h100x8", 2048, 16)
    w = Workload.load(case.model, case.cluster, seq=case.seq, global_batch=case.global_batch)
    plan = Plan.parse("dp=4,cp=2,zero=3,mbs=2", num_gpus=8)
    cand = SimpleNamespace(plan=plan, estimate=w.estimator(EstimateOptions()).estimate(plan, 16, detail=False))
    (row,) = csm.check_candidate(case, w, "top-5 #1", cand)
    assert row.skipped.startswith("cp=2") and not row.measured and row.fits is None
    assert row.limit_gib == pytest.approx(row.hbm_gib - 4.0) and 0 < row.search_gib < row.limit_gib


@pytest.mark.slow        # a search and memcheck of its results, > 20 s on 2 cores
def test_search_results_fit_under_the_tracker_on_a_small_case(experiment):
    csm = experiment("check_search_memory")
    rows = csm.check_case(csm.Case(SMALL, "h100x8", 2048, 16), top_k=3)
    got = [r for r in rows if r.measured]
    assert got, rows
    assert len({r.plan for r in rows}) >= 3          # every search result is a row, run or not
    for r in got:
        assert 0 < r.tracker_gib <= r.limit_gib == pytest.approx(r.hbm_gib - r.margin_gib)
        assert abs(r.error) <= csm.TOLERANCE, r
        assert r.estimate_gib <= r.search_gib + 1e-9     # the search reports the plan's highest rank
    assert csm.verdict(rows) == 0
