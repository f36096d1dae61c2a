"""Llama 3.1 8B (meta-llama/Llama-3.1-8B): 8,030,261,248 parameters.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import LlamaConfig, LlamaForCausalLM

LAYERS = 32
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> LlamaConfig:
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                       rope_theta=500000.0, tie_word_embeddings=False, attn_implementation="sdpa")


def build_model():
    return LlamaForCausalLM(config(TEST_LAYERS))
