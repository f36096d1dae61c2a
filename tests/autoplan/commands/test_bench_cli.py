"""``autoplan bench --suite quick`` end to end: files, real values, a failing case, the cache, errors."""
from __future__ import annotations

import csv
import json
import time

import pytest

from autoplan.bench import CONTENDERS, SUITES

QUICK = [c.name for c in SUITES["quick"]]
FAILING = "does-not-fit-h100x8"
TOLERANCE = 1e-3          # relative: auto may not be slower than a hand plan in the same cost model


@pytest.fixture(scope="module")
def quick(cli, tmp_path_factory):
    """One run of the quick suite (the expensive part), its outputs, stderr and wall time."""
    out = tmp_path_factory.mktemp("bench") / "quick"
    md = out.parent / "RESULTS.md"
    md.write_text("# Results\n\n<!-- other:start -->\nkeep me\n<!-- other:end -->\n")
    start = time.perf_counter()
    r = cli("bench", "--suite", "quick", "--out", str(out), "--results-md", str(md))
    seconds = time.perf_counter() - start
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    return {"out": out, "md": md, "r": r, "seconds": seconds, "results": results,
            "cases": {c["case"]["name"]: c for c in results["cases"]}}


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_quick_suite_writes_every_output(quick):
    out = quick["out"]
    for name in ("results.json", "results.csv", "table.md", "mfu.png", "ratio.png", "search_time.png"):
        assert (out / name).stat().st_size > 0, name
    for name in QUICK:
        assert (out / "cases" / f"{name}.json").exists()
    assert (out / "mfu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert quick["results"]["suite"] == "quick" and list(quick["cases"]) == QUICK
    assert "auto vs hand-written 4D" in quick["r"].stdout


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_quick_suite_is_quick(quick):
    assert quick["seconds"] < 60, f"quick suite took {quick['seconds']:.0f} s"


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_every_contender_priced_with_real_values(quick):
    for name in QUICK:
        if name == FAILING:
            continue
        case = quick["cases"][name]
        assert case["status"] == "ok", case["error"]
        rows = {r["contender"]: r for r in case["contenders"]}
        assert list(rows) == list(CONTENDERS)
        for row in rows.values():
            assert row["status"] in ("ok", "n/a"), row
            if row["status"] == "n/a":
                assert row["error"] and row["kind"] == "recipe"
                continue
            assert 0 < row["mfu"] < 1 and row["step_time_s"] > 0 and row["memory_gib"] > 0
            assert row["tokens_per_s"] == pytest.approx(
                case["case"]["seq"] * case["case"]["global_batch"] / row["step_time_s"], rel=1e-4)
        auto = rows["auto"]
        assert auto["fits"] and auto["respects_nvlink"] and case["search_s"] > 0
        assert rows["grid"]["status"] == "ok" and rows["grid"]["respects_nvlink"]
        assert "tp=" in auto["plan"] and "order=" in auto["plan"]


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_auto_is_no_worse_than_hand(quick):
    """Same cost model: the search's plan is at least as fast as the best rule-respecting recipe and grid plan."""
    for name in QUICK:
        case = quick["cases"][name]
        if name == FAILING:
            continue
        assert case["best_hand"] in CONTENDERS[2:]
        assert case["auto_vs_hand"] >= 1 - TOLERANCE, (name, case["auto_vs_hand"])
        assert case["auto_vs_grid"] >= 1 - TOLERANCE, (name, case["auto_vs_grid"])
        assert case["auto_vs_hand_any"] <= case["auto_vs_hand"] + 1e-9
        rows = {r["contender"]: r for r in case["contenders"]}
        hand = rows[case["best_hand"]]
        assert case["auto_vs_hand"] == pytest.approx(rows["auto"]["tokens_per_s"] / hand["tokens_per_s"], rel=1e-4)


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_dense_model_marks_deepseek_not_applicable(quick):
    rows = {r["contender"]: r for r in quick["cases"]["gpt-1.7b-h100x64"]["contenders"]}
    assert rows["deepseek"]["status"] == "n/a" and "dense model" in rows["deepseek"]["error"]


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_failing_case_is_logged_and_the_suite_goes_on(quick):
    case = quick["cases"][FAILING]
    assert case["status"] == "error" and "fits no plan" in case["error"]
    rows = {r["contender"]: r for r in case["contenders"]}
    assert rows["auto"]["status"] == "error" and case["auto_vs_hand"] is None
    assert all(rows[n]["status"] in ("n/a", "error") or not rows[n]["fits"] for n in CONTENDERS)
    assert f"{FAILING}: FAILED" in quick["r"].stderr
    after = QUICK[QUICK.index(FAILING) + 1:]
    assert after and all(quick["cases"][n]["status"] == "ok" for n in after)


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_csv_has_a_row_per_case_and_contender(quick):
    with open(quick["out"] / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["case"], r["contender"]) for r in rows} == {(c, k) for c in QUICK for k in CONTENDERS}
    auto = next(r for r in rows if r["case"] == "gpt-1.7b-h100x64" and r["contender"] == "auto")
    assert float(auto["mfu"]) > 0 and auto["fits"] == "True" and float(auto["auto_vs_hand"]) > 0


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_results_md_section_written_between_markers(quick):
    text = quick["md"].read_text()
    assert "<!-- other:start -->\nkeep me\n<!-- other:end -->" in text
    assert text.count("<!-- bench:start -->") == 1 and text.count("<!-- bench:end -->") == 1
    section = text[text.index("<!-- bench:start -->"):]
    assert "| gpt-1.7b-h100x64 |" in section and "does-not-fit-h100x8" in section
    assert "![MFU per case](quick/mfu.png)" in section
    assert "autoplan bench --suite quick" in section and "At 100B+ parameters" in section


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_rerun_skips_cached_cases_and_force_reruns(quick, cli):
    out = quick["out"]
    before = (out / "cases" / "gpt-1.7b-h100x64.json").read_text()
    r = cli("bench", "--suite", "quick", "--out", str(out), "--cases", "gpt-1.7b-h100x64," + FAILING)
    assert r.returncode == 0, r.stderr
    assert "gpt-1.7b-h100x64: cached" in r.stderr and f"{FAILING}: cached" in r.stderr
    results = json.loads((out / "results.json").read_text())
    assert [c["case"]["name"] for c in results["cases"]] == QUICK        # outputs still cover the suite
    r = cli("bench", "--suite", "quick", "--out", str(out), "--cases", "gpt-1.7b-h100x64", "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert "cached" not in r.stderr and json.loads(r.stdout)["suite"] == "quick"
    after = json.loads((out / "cases" / "gpt-1.7b-h100x64.json").read_text())
    assert after["case_s"] != json.loads(before)["case_s"] or after["search_s"] != json.loads(before)["search_s"]
    assert after["contenders"] == json.loads(before)["contenders"]           # deterministic plans and prices


def test_bad_input_exits_2(cli, tmp_path, capsys):
    from autoplan.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    for args, words in ((("--cases", "nope"), "unknown case 'nope'"),
                        (("--cases", ","), "names no case"),
                        (("--workers", "-1"), "--workers -1 is out of range"),
                        (("--search-timeout", "-5"), "--search-timeout -5.0 is out of range"),
                        (("--out", str(blocker / "sub")), "cannot create the output folder")):
        assert main(["bench", "--suite", "quick", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and "Traceback" not in err
    r = cli("bench", "--suite", "quick", "--cases", "nope")        # the same through a real process
    assert r.returncode == 2 and r.stderr.startswith("error: unknown case 'nope'") and r.stdout == ""
