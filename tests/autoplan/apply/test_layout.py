"""The model probe: block stack, parameter regions and Megatron's default tp roles from the data flow."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autoplan import zoo
from autoplan.apply.layout import COLWISE, EMBEDDING, REPLICATE, ROWWISE, find_blocks, probe
from autoplan.errors import UserError
from autoplan.zoo.spec import parse_spec

GPT = "gpt:layers=2,hidden=32,heads=4,vocab=64,dropout=0"
LLAMA = "llama:layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,ffn=64"
MOE = "moe:layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,experts=4,topk=2,moe_ffn=32,shared_experts=1"


def _layout(spec):
    torch.manual_seed(0)
    model = zoo.build(parse_spec(spec))
    return model, probe(model, torch.zeros(1, 8, dtype=torch.long))


def test_gpt_layout_finds_blocks_regions_and_megatron_pairs():
    model, layout = _layout(GPT)
    assert (layout.blocks_path, layout.num_blocks, layout.vocab) == ("layers", 2, 64)
    assert layout.pre == {"wte.weight", "wpe.weight"}
    assert layout.head_weights == {"wte.weight"}
    assert layout.post == {"wte.weight", "ln_f.weight", "ln_f.bias"}         # tied head reads wte
    roles = layout.roles
    for i in range(2):
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.up_proj"):
            assert roles[f"layers.{i}.{name}"] == COLWISE
        for name in ("attn.o_proj", "mlp.down_proj"):
            assert roles[f"layers.{i}.{name}"] == ROWWISE
    assert roles["wte"] == roles["wpe"] == EMBEDDING
    assert layout.index_ndim == {"wte": 2, "wpe": 1}                         # position ids are 1-D
    assert "layers.0.attn.o_proj" in layout.stream_shaped
    assert "layers.0.attn.q_proj" in layout.stream_shaped                    # [1, 8, 32] too
    assert layout.block_of("layers.1.mlp.up_proj.weight") == 1 and layout.block_of("wte.weight") is None


def test_llama_head_is_colwise_and_swiglu_pairs_two_linears():
    _, layout = _layout(LLAMA)
    assert layout.pre == {"tok_embeddings.weight"}
    assert layout.post == {"norm.weight", "output.weight"}
    assert layout.head_weights == {"output.weight"}      # the head is applied with F.linear
    assert layout.roles["layers.0.feed_forward.gate_proj"] == COLWISE
    assert layout.roles["layers.0.feed_forward.up_proj"] == COLWISE
    assert layout.roles["layers.0.feed_forward.down_proj"] == ROWWISE


def test_moe_router_is_replicated_and_shared_expert_is_paired():
    _, layout = _layout(MOE)
    assert layout.roles["layers.0.moe.router"] == REPLICATE
    assert layout.roles["layers.0.moe.shared.gate_proj"] == COLWISE
    assert layout.roles["layers.0.moe.shared.down_proj"] == ROWWISE
    assert "moe.routed.w_gate" in layout.block_params[0]


def test_linear_chain_starts_a_new_pair_after_a_row_parallel_linear():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.d = (nn.Linear(8, 8) for _ in range(4))

        def forward(self, x):
            return x + self.d(torch.relu(self.c(self.b(torch.relu(self.a(x))))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.blocks = nn.ModuleList([Block()])

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return x

    layout = probe(Net(), torch.zeros(1, 4, dtype=torch.long))
    roles = {k.split(".")[-1]: v for k, v in layout.roles.items() if k.startswith("blocks")}
    assert roles == {"a": COLWISE, "b": ROWWISE, "c": COLWISE, "d": ROWWISE}


def test_a_model_without_a_block_list_is_a_user_error():
    with pytest.raises(UserError, match="no nn.ModuleList"):
        find_blocks(nn.Sequential())
    with pytest.raises(UserError, match="no nn.ModuleList"):
        find_blocks(nn.Linear(2, 2))


def test_a_forward_that_skips_its_blocks_is_a_user_error():
    class Lazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4)])
            self.emb = nn.Embedding(8, 4)

        def forward(self, ids):
            return self.emb(ids)

    with pytest.raises(UserError, match="never called its blocks"):
        probe(Lazy(), torch.zeros(1, 2, dtype=torch.long))
