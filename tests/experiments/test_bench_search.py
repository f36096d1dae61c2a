"""experiments/bench_search.py --worst: the RESULTS table and the README paragraph it writes."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(model, cluster, new_s, same=True):
    return {"model": model, "cluster": cluster, "seq": 2048, "batch": 1536, "trace_s": 1.0, "old_s": 4 * new_s,
            "new_s": new_s, "old_cpu": 6 * new_s, "new_cpu": 1.5 * new_s, "old_priced": 900, "new_priced": 100,
            "best": "tp=8", "same_best": True, "same_json": same, "ratio": 4.0, "cpu_ratio": 4.0, "load": (2.5, 3.5)}


def test_readme_paragraph_names_the_headline_and_the_slowest_row(experiment):
    bench = experiment("bench_search")
    rows = [_row("gpt3-175b", "h100x1024", 3.0), _row("gpt-1t", "h100x1024", 8.5, same=False),
            _row("llama3-405b", "h100x16384", 5.0)]
    text = bench.readme_summary(rows)
    assert "gpt3-175b on h100x1024 in 3.0 s (4.5 CPU s); llama3-405b on h100x16384 in 5.0 s" in text
    assert "Worst of the 3 rows" in text
    assert "gpt-1t on h100x1024 in 8.5 s (12.8 CPU s) (its trace 1.0 s more), 4.0x" in text
    assert "load average 2.5–3.5 on its 2 cores" in text
    assert "byte-identical to the reference path in 2 of 3 rows" in text
    table = bench.worst_markdown(rows)
    assert ("| gpt-1t | h100x1024 | 2048 × 1536 | 34.0 | 8.5 | 4.00 | 51.0 | 12.8 | 4.00 | 900 → 100 | NO | `tp=8` "
            "| 1.0 | 2.5 → 3.5 |") in table


def test_readme_section_is_written_between_its_markers(tmp_path, experiment):
    bench = experiment("bench_search")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- search_speed:start -->\nold\n<!-- search_speed:end -->\n\n## After\n")
    bench.write_section("search_speed", "Search speed", "new text\n", path=str(readme))
    out = readme.read_text()
    assert "old" not in out and "### Search speed\n\nnew text\n<!-- search_speed:end -->\n\n## After" in out


def test_the_repository_readme_has_the_section():
    assert "<!-- search_speed:start -->" in open(os.path.join(REPO, "README.md")).read()
