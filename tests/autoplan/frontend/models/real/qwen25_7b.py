"""Qwen2.5 7B (Qwen/Qwen2.5-7B): 7,615,616,512 parameters.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import Qwen2Config, Qwen2ForCausalLM

LAYERS = 28
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> Qwen2Config:
    return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=layers,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
                       tie_word_embeddings=False, attn_implementation="sdpa")


def build_model():
    return Qwen2ForCausalLM(config(TEST_LAYERS))
