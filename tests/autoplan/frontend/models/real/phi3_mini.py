"""Phi-3-mini-4k (microsoft/Phi-3-mini-4k-instruct): 3,821,079,552 parameters, fused qkv and gate/up projections.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import Phi3Config, Phi3ForCausalLM

LAYERS = 32
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> Phi3Config:
    return Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                      original_max_position_embeddings=4096, sliding_window=None, tie_word_embeddings=False,
                      pad_token_id=32000, attn_implementation="sdpa")


def build_model():
    return Phi3ForCausalLM(config(TEST_LAYERS))
