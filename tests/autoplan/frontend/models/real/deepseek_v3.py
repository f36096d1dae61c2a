"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3) without its multi-token-prediction layer: 671,026,419,200
parameters; MLA (q/k head 192, v head 128), 3 dense layers then 58 MoE layers of 256 routed experts
(top-8) and 1 shared.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 4-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

LAYERS = 61
TEST_LAYERS = 4


def config(layers: int = LAYERS) -> DeepseekV3Config:
    return DeepseekV3Config(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                            num_hidden_layers=layers, first_k_dense_replace=min(3, layers // 2),
                            num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                            n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,
                            q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                            v_head_dim=128, max_position_embeddings=163840, tie_word_embeddings=False,
                            attn_implementation="sdpa", experts_implementation="grouped_mm")


def build_model():
    return DeepseekV3ForCausalLM(config(TEST_LAYERS))
