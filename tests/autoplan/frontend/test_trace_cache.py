"""The trace cache: keyed on what changes a trace, bad entries discarded, concurrent writers safe."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.frontend import cache
from autoplan.frontend.tracing import trace_with_status

REPO = Path(__file__).resolve().parents[3]
TINY = "gpt:layers=2,hidden=64,heads=4,vocab=128"


def test_truncated_and_wrong_typed_entries_are_discarded_and_retraced(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    g, cached = trace_with_status(TINY, seq=16)
    assert not cached and trace_with_status(TINY, seq=16)[1]
    [entry] = tmp_path.glob("*.json")
    whole = entry.read_bytes()
    for bad in (whole[: len(whole) // 2], whole.replace(b'"layers": 2', b'"layers": "2"'), b"", b"\x00\xff"):
        entry.write_bytes(bad)
        again, cached = trace_with_status(TINY, seq=16)
        assert not cached and again.blocks == g.blocks and again.model == g.model
        assert trace_with_status(TINY, seq=16)[1]          # the retrace was stored whole
        whole = entry.read_bytes()


def test_key_covers_local_imports(tmp_path):
    helper = tmp_path / "helper.py"
    model = tmp_path / "model.py"
    helper.write_text("WIDTH = 16\n")
    model.write_text("from helper import WIDTH\nimport torch\n")
    key = cache.cache_key("fp", 16, 1, "bf16", model_path=str(model))
    assert cache.local_imports(str(model)) == [helper.resolve()]
    helper.write_text("WIDTH = 32\n")
    assert cache.cache_key("fp", 16, 1, "bf16", model_path=str(model)) != key
    assert cache.cache_key("fp", 16, 1, "bf16") != cache.cache_key("fp", 16, 2, "bf16")
    assert cache.cache_key("fp", 16, 1, "bf16") != cache.cache_key("fp", 16, 1, "fp32")


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
def test_two_searches_sharing_a_cache_agree_with_one_alone(tmp_path):
    argv = [sys.executable, "-m", "autoplan", "search", "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128",
            "--cluster", "h100x16", "--seq", "64", "--global-batch", "32", "--top", "2", "--json", "--workers", "1"]

    def env(d):
        return dict(os.environ, AUTOPLAN_CACHE_DIR=str(tmp_path / d), PYTHONPATH=str(REPO))
    together = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                 env=env("shared")) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in together]
    alone = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env("alone"), timeout=600)
    assert all(p.returncode == 0 for p in together), [o[1] for o in outs]
    assert alone.returncode == 0, alone.stderr
    assert outs[0][0] == outs[1][0] == alone.stdout
    assert len(list((tmp_path / "shared").glob("*.json"))) == 1
    assert list((tmp_path / "shared").glob("*.tmp")) == []


def test_a_cached_graph_carries_the_name_it_is_asked_for(tmp_path, monkeypatch):
    """Two spellings of one architecture share a cache entry (the key is the architecture), but each
    traced graph is named as asked: before, the second got the first one's name."""
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path))
    other = "gpt:vocab=128,heads=4,hidden=64,layers=2"
    first, cached = trace_with_status(TINY, seq=16)
    second, hit = trace_with_status(other, seq=16)
    assert (cached, hit) == (False, True) and len(list(tmp_path.glob("*.json"))) == 1
    assert (first.model.name, second.model.name) == (TINY, other)
    assert second.blocks == first.blocks
