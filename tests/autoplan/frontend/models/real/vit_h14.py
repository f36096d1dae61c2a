"""ViT-H/14 (Dosovitskiy et al. 2021; google/vit-huge-patch14-224-in21k) for 1,000-class
image classification at 224 px: 32 layers, hidden 1280, 257 positions (256 patches + class token).

Built from a transformers config (no download); ``config(layers)`` is the real model at
``layers`` layers, ``build_model()`` the 2-layer version the tests trace (its per-layer
parameters are the real model's).  Inputs are images, not tokens: ``seq`` does not reach it.
"""
import torch
from transformers import ViTConfig, ViTForImageClassification

LAYERS = 32
TEST_LAYERS = 2


def config(layers: int = LAYERS) -> ViTConfig:
    return ViTConfig(hidden_size=1280, num_hidden_layers=layers, num_attention_heads=16, intermediate_size=5120,
                     image_size=224, patch_size=14, num_labels=1000, attn_implementation="sdpa")


def build_model():
    return ViTForImageClassification(config(TEST_LAYERS))


def example_inputs(batch, seq):
    return (torch.randn(batch, 3, 224, 224),)
