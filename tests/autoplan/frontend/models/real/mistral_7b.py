"""Mistral 7B v0.1 (mistralai/Mistral-7B-v0.1): 7,241,732,096 parameters, 4,096-token sliding window.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import MistralConfig, MistralForCausalLM

LAYERS = 32
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> MistralConfig:
    return MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                         sliding_window=4096, tie_word_embeddings=False, attn_implementation="sdpa")


def build_model():
    return MistralForCausalLM(config(TEST_LAYERS))
