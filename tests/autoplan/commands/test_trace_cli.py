"""``autoplan trace``: output, and one clear message (exit 2, no traceback) for each bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

MODELS = Path(__file__).parents[1] / "frontend" / "models"   # the frontend tests' model files


def test_trace_json(cli):
    r = cli("trace", "gpt:layers=2,hidden=64,heads=4,vocab=128", "--seq", "64", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["params"]["total"] == 2 * (12 * 64 * 64 + 13 * 64) + 128 * 64 + 2048 * 64 + 2 * 64
    assert s["params"]["head_tied_to_embedding"] is True
    assert [(b["kind"], b["count"]) for b in s["blocks"]] == [("dense0", 2)]
    assert len(s["heaviest_ops"]) == 10 and abs(sum(o["share"] for o in s["heaviest_ops"])) <= 1.0
    assert 0 < s["attention_flops_share"] < 1
    assert s["flops_per_token"] > 6 * s["params"]["total"] * 0.5
    assert s["trace_seconds"] > 0 and s["trace_peak_rss_bytes"] > 0
    assert list(s) == sorted(s)


def test_trace_table(cli):
    r = cli("trace", "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=128", "--seq", "64")
    assert r.returncode == 0, r.stderr
    for words in ("parameters", "Unique blocks", "Heaviest ops", "attention:", "peak RSS"):
        assert words in r.stdout


BAD_FILES = {
    "syntax.py": ("import torch\ndef build_model(:\n    pass\n", ["syntax.py:2", "syntax error"]),
    "nobuild.py": ("import torch\nX = 1\n", ["defines no build_model()"]),
    "model.txt": ("def build_model():\n    pass\n", ["is not a Python file"]),
    "raises.py": ("def helper():\n    raise RuntimeError('no GPU config found')\n\n"
                  "def build_model():\n    return helper()\n",
                  ["no GPU config found", "raises.py:2", "RuntimeError"]),
    "branchy.py": ("import torch\nfrom torch import nn\n\n"
                   "class Branchy(nn.Module):\n"
                   "    def __init__(self):\n"
                   "        super().__init__()\n"
                   "        self.embed = nn.Embedding(10, 8)\n"
                   "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))\n\n"
                   "    def forward(self, ids):\n"
                   "        x = self.embed(ids)\n"
                   "        if x.sum() > 0:\n"
                   "            x = x * 2\n"
                   "        for layer in self.layers:\n"
                   "            x = layer(x)\n"
                   "        return x\n\n"
                   "def build_model():\n    return Branchy()\n",
                   ["data-dependent control flow", "branchy.py:12", "if x.sum() > 0", "torch.where",
                    "_local_scalar_dense"]),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_model_files(cli, tmp_path, name):
    text, words = BAD_FILES[name]
    path = tmp_path / name
    path.write_text(text)
    r = cli("trace", str(path), "--seq", "8")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.mark.parametrize("args, words", [
    (["/nonexistent/model.py"], ["not found"]),
    (["gpt:layers=2,hidden=64"], ["missing key(s) heads, vocab", "valid keys for gpt"]),
    (["gpt:layers=2,hidden=64,heads=4,vocab=128,depth=3"], ["unknown key 'depth'", "valid keys for gpt"]),
    (["llama3-9b"], ["unknown model 'llama3-9b'", "llama3-8b", "deepseek-v3"]),
    (["gpt3-175b", "--dtype", "int4"], ["unknown dtype 'int4'"]),
    (["gpt3-175b", "--seq", "4096"], ["2048 learned positions"]),
    (["gpt3-175b", "--seq", "1"], ["bad run size"]),
])
def test_bad_arguments(cli, args, words):
    r = cli("trace", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
