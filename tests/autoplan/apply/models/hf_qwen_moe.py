"""A tiny transformers Qwen2-MoE from a config (no download, no wrapper): 3 layers, 4 routed experts
(top-2) and a gated shared expert."""
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM


def build_model():
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=64,
                                              moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                              num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                              max_position_embeddings=128))
