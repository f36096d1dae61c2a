"""experiments/bench.py: the repository's defaults for ``autoplan bench`` (output folder, RESULTS.md)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_default_suite_writes_into_the_repository(monkeypatch, experiment):
    monkeypatch.chdir(REPO)
    args = experiment("bench").with_repo_defaults(["--force"])
    assert args == ["bench", "--force", "--out", os.path.join("experiments", "bench"),
                    "--results-md", os.path.join("experiments", "RESULTS.md")]


def test_other_suites_and_explicit_paths_are_left_alone(monkeypatch, experiment):
    monkeypatch.chdir(REPO)
    bench = experiment("bench")
    assert bench.with_repo_defaults(["--suite", "quick"]) == [
        "bench", "--suite", "quick", "--out", os.path.join("experiments", "bench-quick")]
    assert bench.with_repo_defaults(["--out=/tmp/x", "--results-md", "R.md"]) == [
        "bench", "--out=/tmp/x", "--results-md", "R.md"]
