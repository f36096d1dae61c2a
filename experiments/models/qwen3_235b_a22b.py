"""Qwen3-235B-A22B (Qwen3 technical report; its Hugging Face config): 94 layers, hidden 4,096, 64 query
heads of 128 and 4 KV heads, 128 routed experts of width 1,536, top-8, no shared expert, vocabulary
151,936 — the model of the Megatron-Core model zoo's and Megatron-Bridge's Qwen3-235B rows
(``../shared/reference/regimes3_public.json``), built as the zoo's MoE transformer.

    autoplan search experiments/models/qwen3_235b_a22b.py --cluster h100x256 --seq 4096 --global-batch 2048
"""
from autoplan.zoo.moe import MoEConfig, MoETransformer

CONFIG = MoEConfig(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=12288, vocab=151936,
                   experts=128, topk=8, moe_ffn=1536, norm_eps=1e-6, rope_theta=1e6)


def build_model():
    return MoETransformer(CONFIG)
