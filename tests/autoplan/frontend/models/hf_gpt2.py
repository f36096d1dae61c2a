"""A small GPT-2 built from a transformers config (no download): 3 layers, hidden 128."""
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    config = GPT2Config(vocab_size=1000, n_positions=4096, n_embd=128, n_layer=3, n_head=4,
                        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(config)
