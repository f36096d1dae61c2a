"""Gemma 2 9B (google/gemma-2-9b): 9,241,705,984 parameters; local (4,096-token window) and global
layers alternate, attention logits soft-capped at 50 (eager attention, as transformers runs Gemma 2).

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import Gemma2Config, Gemma2ForCausalLM

LAYERS = 42
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> Gemma2Config:
    return Gemma2Config(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=layers,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096,
                        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                        max_position_embeddings=8192, attn_implementation="eager")


def build_model():
    return Gemma2ForCausalLM(config(TEST_LAYERS))
