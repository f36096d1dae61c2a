"""The GEMM-efficiency ranges of the shipped compute profiles come from residuals on public rows
(issue 13): each profile's ``uncertainty.gemm_peak`` spans 1 + the smallest … 1 + the largest
residual its source lists (and 1), and names rows of the public set only."""
import os
import re
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments"))

from profile_ranges import HEADER, gemm_range_block  # noqa: E402

PUBLIC = {"a100": ("calibration_runs.md", "SC21 T1 ", "Korthikanti "),
          "h100": ("public H100 rows", "tt-h100-", "llama3-405b-8k", "ngc-nemotron4-340b")}


def _residuals(source: str) -> list[tuple[str, float]]:
    listed = source.split(": ", 1)[1]
    return [(m.group(1), float(m.group(2)) / 100) for m in re.finditer(r"([^,]+?) ([+-]\d+\.\d)%", listed)]


@pytest.mark.parametrize("gpu", sorted(PUBLIC))
def test_profile_gemm_range_is_the_span_of_its_public_residuals(gpu):
    with open(os.path.join(REPO, "costmodels", "profiles", f"{gpu}.yaml")) as f:
        spec = yaml.safe_load(f)["uncertainty"]["gemm_peak"]
    where, *prefixes = PUBLIC[gpu]
    assert where in spec["source"] and "held" not in spec["source"].lower()
    rows = _residuals(spec["source"])
    assert len(rows) >= 4
    assert all(any(name.strip().startswith(p) for p in prefixes) for name, _ in rows), rows
    errors = [e for _, e in rows]
    assert spec["low"] == pytest.approx(1 + min(0.0, *errors), abs=6e-4)
    assert spec["high"] == pytest.approx(1 + max(0.0, *errors), abs=6e-4)


def test_range_block_spans_the_residuals_and_always_the_point():
    block = gemm_range_block([0.02, 0.05], ["a", "b"], "rows")
    data = yaml.safe_load(block)["uncertainty"]["gemm_peak"]
    assert block.startswith(HEADER)
    assert (data["low"], data["high"]) == (1.0, 1.05)
    assert data["source"] == "residuals of this fit on rows: a +2.0%, b +5.0%"
    with pytest.raises(ValueError):
        gemm_range_block([0.1], ["a", "b"], "rows")


@pytest.mark.parametrize("gpu", ["a100", "h100", "b200"])
def test_every_range_says_its_source_and_none_is_held_out(gpu):
    from autoplan.cost.params import ranges
    for r in ranges(gpu):
        assert r.source and "held" not in r.source.lower(), (r.name, r.source)
