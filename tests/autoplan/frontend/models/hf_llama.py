"""A small Llama built from a transformers config (no download): 4 layers, hidden 256."""
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)
