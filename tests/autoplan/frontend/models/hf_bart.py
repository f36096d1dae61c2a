"""A small BART built from a transformers config (no download): encoder and decoder of 2 layers."""
from transformers import BartConfig, BartForConditionalGeneration


def build_model():
    config = BartConfig(vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                        decoder_ffn_dim=256, max_position_embeddings=1024, attn_implementation="sdpa")
    return BartForConditionalGeneration(config)
