"""DeepSeek-V3 as ``deepseek_v3.py`` but with transformers' eager attention (materialised scores)."""
from deepseek_v3 import TEST_LAYERS, config
from transformers import DeepseekV3ForCausalLM


def build_model():
    c = config(TEST_LAYERS)
    c._attn_implementation = "eager"
    return DeepseekV3ForCausalLM(c)
