"""model.py sources: HuggingFace models built from configs (no download) and plain custom models."""
from __future__ import annotations

from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"
needs_transformers = pytest.mark.skipif(__import__("importlib").util.find_spec("transformers") is None,
                                        reason="transformers is not installed")


@needs_transformers
def test_hf_llama(traced):
    g = traced(str(MODELS / "hf_llama.py"), seq=64)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 4)]
    assert g.blocks[0].module_paths == tuple(f"model.layers.{i}" for i in range(4))
    assert g.blocks[0].description == "flash attention + SwiGLU MLP"
    m = g.model
    assert (m.family, m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab) == \
        ("hf", 4, 256, 8, 4, 32, 688, 1000)
    params = {n.param for n in g.blocks[0].graph.params()}
    assert "self_attn.q_proj.weight" in params and "mlp.down_proj.weight" in params


@needs_transformers
def test_hf_gpt2(traced):
    g = traced(str(MODELS / "hf_gpt2.py"), seq=64)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 3)]
    assert g.model.tied_embeddings
    assert not any("guessed" in note for note in g.model.notes)


@needs_transformers
def test_hf_mixtral(traced):
    g = traced(str(MODELS / "hf_mixtral.py"), seq=64)
    assert [(b.kind, b.count) for b in g.blocks] == [("moe0", 2)]
    assert (g.model.experts, g.model.topk) == (4, 2)
    graph = g.blocks[0].graph
    assert any(n.op == "aten._grouped_mm.default" and n.gemm for n in graph.ops())
    experts = [n for n in graph.params() if n.out.shape[0] == 4 and len(n.out.shape) == 3]
    assert experts and all(n.out.dim_roles[0] == "expert" for n in experts)


@needs_transformers
def test_hf_param_count_matches_module():
    import torch

    from autoplan.frontend import trace
    from autoplan.frontend.source import load_source

    with torch.device("meta"):
        model = load_source(str(MODELS / "hf_llama.py")).build()
    assert trace(str(MODELS / "hf_llama.py"), seq=64).param_count == sum(p.numel() for p in model.parameters())


@needs_transformers
def test_hf_bart_encoder_decoder(traced):
    import torch

    from autoplan.frontend.source import load_source

    g = traced(str(MODELS / "hf_bart.py"), seq=64)
    assert [(b.kind, b.module_paths) for b in g.blocks] == [
        ("dense0", ("model.encoder.layers.0", "model.encoder.layers.1")),
        ("dense1", ("model.decoder.layers.0", "model.decoder.layers.1"))]
    assert g.order == ("dense0", "dense0", "dense1", "dense1") and g.model.encoder_layers == 2
    with torch.device("meta"):
        model = load_source(str(MODELS / "hf_bart.py")).build()
    assert g.param_count == sum(p.numel() for p in model.parameters())
    # every attention (encoder, decoder causal self-attention despite BART's own all-ones padding
    # mask, cross-attention) runs as flash attention, with no materialised mask
    kernels = [n.op for b in g.blocks for n in b.graph.ops("forward") if "attention" in n.op]
    assert kernels == ["aten._scaled_dot_product_flash_attention.default"] * 3


def test_example_inputs_as_keywords(tmp_path, traced):
    path = tmp_path / "kw.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Block(nn.Module):\n"
        "    def __init__(s):\n        super().__init__(); s.fc = nn.Linear(16, 16)\n"
        "    def forward(s, x): return x + s.fc(x)\n"
        "class M(nn.Module):\n"
        "    def __init__(s):\n"
        "        super().__init__(); s.layers = nn.ModuleList([Block(), Block()]); s.head = nn.Linear(16, 10)\n"
        "    def forward(s, *, features, scale):\n"
        "        x = features * scale\n"
        "        for l in s.layers: x = l(x)\n"
        "        return s.head(x)\n"
        "def build_model(): return M()\n"
        "def example_inputs(batch, seq): return {'features': torch.randn(batch, 7, 16), 'scale': 2.0}\n")
    g = traced(str(path), seq=32)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 2)]
    assert (g.model.token_inputs, g.model.throughput_unit, g.model.positions) == (False, "samples", 7)


def test_custom_model_with_example_inputs(traced):
    g = traced(str(MODELS / "custom_lm.py"), seq=32)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 3)]
    assert (g.model.family, g.model.layers, g.model.hidden, g.model.vocab) == ("custom", 3, 96, 512)
    assert g.model.tied_embeddings                      # found from the traced graphs
    assert g.param_count == 512 * 96 + 3 * (4 * (96 * 96 + 96) + 2 * 2 * 96 + 2 * 4 * 96 * 96 + 4 * 96 + 96) + 2 * 96
    assert any(n.role == "loss" for n in g.post.nodes)  # cross-entropy added over the vocab dim


def test_custom_model_returning_its_loss(traced):
    g = traced(str(MODELS / "custom_loss.py"), seq=32)
    assert [(b.kind, b.count) for b in g.blocks] == [("dense0", 2)]
    loss = [n for n in g.post.nodes if n.role == "loss"]
    assert len(loss) == 1 and loss[0].out.shape == ()
    assert g.post.output_roles[0] == "loss"
    # the model's own labels are an input that gets no gradient
    assert any(n.role == "side_input" and n.out.dtype == "int64" for n in g.post.nodes)


def test_model_without_layer_list(tmp_path):
    from autoplan.frontend import trace

    path = tmp_path / "flat.py"
    path.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Flat(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(50, 16)\n"
        "        self.proj = nn.Linear(16, 50)\n"
        "    def forward(self, ids):\n"
        "        return self.proj(self.embed(ids))\n"
        "def build_model():\n"
        "    return Flat()\n")
    g = trace(str(path), seq=8)
    assert g.blocks == () and g.order == () and g.pre.nodes == ()
    assert g.param_count == 50 * 16 + 16 * 50 + 50


@pytest.mark.parametrize("name", ["hf_llama.py", "hf_gpt2.py", "hf_mixtral.py", "custom_lm.py"])
def test_example_models_run_for_real(name):
    """The example files build real (small) models that run a forward pass on CPU."""
    import torch

    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    from autoplan.frontend.source import load_source

    model = load_source(str(MODELS / name)).build()
    out = model(torch.randint(0, 100, (1, 8)))
    logits = out if isinstance(out, torch.Tensor) else out.logits
    assert torch.isfinite(logits).all()
