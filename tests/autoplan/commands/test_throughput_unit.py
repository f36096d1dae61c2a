"""Throughput in the model's own unit: samples/s for inputs that are not token ids (images,
features), tokens/s only where the model has tokens; the header states what --seq means."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import topologies
from autoplan.cost import Estimator
from autoplan.plan import Plan

REAL = Path(__file__).parents[1] / "frontend" / "models" / "real"

FEATURES = '''import torch
from torch import nn
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(64, 64)
    def forward(s, x): return x + s.fc(x)
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.layers = nn.ModuleList([Block() for _ in range(4)]); s.head = nn.Linear(64, 10)
    def forward(s, x):
        for l in s.layers: x = l(x)
        return s.head(x)
def build_model(): return M()
def example_inputs(batch, seq): return (torch.randn(batch, 7, 64),)
'''


@pytest.fixture(scope="module")
def features_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("features") / "features.py"
    path.write_text(FEATURES)
    return str(path)


def test_a_feature_model_counts_samples(traced, features_model):
    from autoplan.commands.common import run_header

    g = traced(features_model, seq=4096)
    cluster = topologies.load("h100x8")
    e = json.loads(Estimator(g, cluster).estimate(Plan.parse("dp=8", num_gpus=8), global_batch=64).to_json())
    assert e["throughput_unit"] == "samples"
    assert e["samples_per_s"] == pytest.approx(64 / e["step_time_s"], rel=1e-4)
    # tokens count the 7 positions per sample the blocks see, not --seq 4096
    assert e["tokens_per_s"] == pytest.approx(7 * e["samples_per_s"], rel=1e-4)
    header = run_header(g, cluster, 64)
    assert header.splitlines()[0].endswith(
        "7 positions per sample (not token ids: --seq does not apply), global batch 64 samples")
    assert "seq 4,096" not in header


def test_token_models_keep_tokens(traced):
    from autoplan.commands.common import run_header

    g = traced("gpt:layers=2,hidden=64,heads=4,vocab=128", seq=128)
    cluster = topologies.load("h100x8")
    e = Estimator(g, cluster).estimate(Plan.parse("dp=8", num_gpus=8), global_batch=16)
    assert (e.throughput_unit, e.throughput) == ("tokens", e.tokens_per_s)
    assert e.tokens_per_s == pytest.approx(16 * 128 / e.step_time_s)
    assert e.samples_per_s == pytest.approx(16 / e.step_time_s)
    assert run_header(g, cluster, 16).splitlines() == [
        "[bold]gpt:layers=2,hidden=64,heads=4,vocab=128[/bold] on h100x8, seq 128, global batch 16",
        f"[dim]{cluster.describe()}[/dim]"]


@pytest.mark.slow
def test_estimate_cli_prints_samples_per_second(cli, features_model):
    out = cli("estimate", features_model, "--cluster", "h100x8", "--plan", "dp=8", "--global-batch", "64",
              "--seq", "4096")
    assert out.returncode == 0, out.stderr
    assert "7 positions per sample (not token ids: --seq does not apply), global batch 64 samples" in out.stdout
    assert "samples/s" in out.stdout and "tokens/s" not in out.stdout and "seq 4,096" not in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_vit_throughput_is_images_per_second_at_257_positions(traced):
    """ViT-H/14 at 224 px: 257 positions per image whatever --seq says (the issue saw 2,048)."""
    g = traced(str(REAL / "vit_h14.py"), seq=256)
    assert (g.throughput_unit, g.sample_positions, g.seq_len) == ("samples", 257, 256)
    cluster = topologies.load("h100x8")
    e = Estimator(g, cluster).estimate(Plan.parse("dp=8", num_gpus=8), global_batch=64)
    assert e.throughput_unit == "samples" and e.throughput == e.samples_per_s
    assert e.samples_per_s == pytest.approx(64 / e.step_time_s)
    assert e.tokens_per_s == pytest.approx(257 * e.samples_per_s)
