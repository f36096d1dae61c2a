"""GPT-2 XL (openai-community/gpt2-xl): 1,557,611,200 parameters, tied embeddings.

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).
"""
from transformers import GPT2Config, GPT2LMHeadModel

LAYERS = 48
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> GPT2Config:
    return GPT2Config(n_embd=1600, n_layer=layers, n_head=25, vocab_size=50257, n_positions=1024,
                      attn_implementation="sdpa")


def build_model():
    return GPT2LMHeadModel(config(TEST_LAYERS))
