"""A tiny transformers Llama from a config (no download, no wrapper): 4 layers, hidden 64, GQA."""
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
