"""The trace summary: parameter split, heaviest ops, attention share."""
from __future__ import annotations

import pytest

from autoplan.frontend.summary import attention_flops, heaviest_ops, summarize


def test_summary_of_gpt(traced):
    g = traced("gpt:layers=2,hidden=64,heads=4,vocab=128", seq=32)
    s = summarize(g)
    p = s["params"]
    assert p["total"] == g.param_count
    assert p["embedding"] + p["head"] + sum(b["total"] for b in p["blocks"].values()) == p["total"]
    assert p["head_tied_to_embedding"]
    top = heaviest_ops(g)
    assert len(top) == 10 and top == sorted(top, key=lambda r: -r.flops)


def test_attention_share_eager_matches_flash_up_to_recompute(traced):
    eager = traced("gpt:layers=2,hidden=64,heads=4,vocab=128,attention=eager", seq=64)
    flash = traced("gpt:layers=2,hidden=64,heads=4,vocab=128", seq=64)
    s, h = 64, 64
    # forward QKᵀ and PV: 4·s²·h per layer; eager backward 2× forward, flash 2.5× forward
    assert attention_flops(eager.blocks[0].graph) == pytest.approx(3 * 4 * s * s * h)
    assert attention_flops(flash.blocks[0].graph) == pytest.approx(3.5 * 4 * s * s * h)
    assert 0 < summarize(flash)["attention_flops_share"] < 1
