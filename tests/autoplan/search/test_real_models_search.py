"""Every real-model config of ``tests/autoplan/frontend/models/real`` searches without error on a
cluster it fits (the traced depth, real widths): MLA, sliding windows, soft-capping, T5's two
stacks, ViT's image inputs and Qwen3's 128 experts all reach ranked plans that fit."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import topologies
from autoplan.search import SearchOptions, search

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                 reason="transformers is not installed"), pytest.mark.slow]

REAL = Path(__file__).parents[1] / "frontend" / "models" / "real"
MODELS = sorted(p.stem for p in REAL.glob("*.py"))


def test_every_real_model_config_is_searched():
    assert {"deepseek_v3", "gemma2_9b", "t5_xl", "vit_h14", "qwen3_30b_a3b", "mistral_7b", "phi3_mini"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_real_model_searches_to_fitting_plans(traced, name):
    model = traced(str(REAL / f"{name}.py"), seq=256)
    cluster = topologies.load("h100x8")
    result = search(model, cluster, global_batch=16, options=SearchOptions(top_k=3, workers=1, samples=4))
    assert result.candidates, name
    for c in result.candidates:
        e = c.estimate
        assert c.plan.num_gpus == 8
        assert e.fits and e.memory_gib <= e.hbm_gib - e.memory_margin_gib
        assert e.step_time_s > 0 and 0 < e.mfu < 1
        assert c.band.step(0.1) <= c.band.step(0.5) <= c.band.step(0.9)
