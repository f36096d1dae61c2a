"""Qwen1.5-MoE-A2.7B (Qwen/Qwen1.5-MoE-A2.7B): 14,315,784,192 parameters, 60 experts top-4 and a gated shared expert.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

LAYERS = 24
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> Qwen2MoeConfig:
    return Qwen2MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                          shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                          num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                          max_position_embeddings=8192, tie_word_embeddings=False, attn_implementation="sdpa",
                          experts_implementation="grouped_mm")


def build_model():
    return Qwen2MoeForCausalLM(config(TEST_LAYERS))
