"""A small Mixtral built from a transformers config (no download): 2 layers, 4 experts, top-2.

The default eager expert loop picks tokens with data-dependent indexing; the
``grouped_mm`` experts implementation has static shapes.
"""
from transformers import MixtralConfig, MixtralForCausalLM


def build_model():
    config = MixtralConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=4096,
                           attn_implementation="sdpa", experts_implementation="grouped_mm")
    return MixtralForCausalLM(config)
