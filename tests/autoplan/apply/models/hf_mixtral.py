"""A tiny transformers Mixtral from a config (no download, no wrapper): 4 layers, 4 experts, top-2."""
from transformers import MixtralConfig, MixtralForCausalLM


def build_model():
    return MixtralForCausalLM(MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                                            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, max_position_embeddings=128))
