"""T5-XL v1.1 (google/t5-v1_1-xl): encoder and decoder of 24 layers each, gated-GeLU, untied head.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import T5Config, T5ForConditionalGeneration

LAYERS = 24
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> T5Config:
    return T5Config(vocab_size=32128, d_model=2048, d_kv=64, d_ff=5120, num_layers=layers, num_heads=32,
                    feed_forward_proj="gated-gelu", tie_word_embeddings=False, attn_implementation="sdpa")


def build_model():
    return T5ForConditionalGeneration(config(TEST_LAYERS))
