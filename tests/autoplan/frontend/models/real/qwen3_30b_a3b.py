"""Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B), a Qwen3-MoE: 30,532,122,624 parameters, 128 experts, top-8.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

LAYERS = 48
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_experts=128, num_experts_per_tok=8, num_hidden_layers=layers, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
                          tie_word_embeddings=False, attn_implementation="sdpa", experts_implementation="grouped_mm")


def build_model():
    return Qwen3MoeForCausalLM(config(TEST_LAYERS))
