"""Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): 46,702,792,704 parameters, 8 experts, top-2.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import MixtralConfig, MixtralForCausalLM

LAYERS = 32
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> MixtralConfig:
    return MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                         max_position_embeddings=32768, sliding_window=None, tie_word_embeddings=False,
                         attn_implementation="sdpa", experts_implementation="grouped_mm")


def build_model():
    return MixtralForCausalLM(config(TEST_LAYERS))
