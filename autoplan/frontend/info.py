"""``ModelInfo`` for models that do not come from the zoo: HuggingFace configs or parameter shapes."""
from __future__ import annotations

from torch import nn

from autoplan.frontend.blocks import LayerStack
from autoplan.ir import ModelInfo


def _first(config, *names: str, default: int = 0) -> int:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def _sliding_window(config) -> int:
    """The config's sliding window, 0 when it has none or turns it off (Qwen2's ``use_sliding_window``)."""
    if getattr(config, "use_sliding_window", True) is False:
        return 0
    return _first(config, "sliding_window")


def hf_model_info(name: str, model: nn.Module, stack: LayerStack | None) -> ModelInfo:
    """Facts read from a transformers ``PretrainedConfig``."""
    c = model.config
    hidden = _first(c, "hidden_size", "n_embd", "d_model")
    heads = _first(c, "num_attention_heads", "n_head", "encoder_attention_heads")
    # MLA configs (DeepSeek-V2/V3) call the rotary part "head_dim"; the q/k head is qk_head_dim
    head_dim = _first(c, "qk_head_dim", "head_dim", "d_kv", default=hidden // heads if heads else 0)
    v_head_dim = _first(c, "v_head_dim")
    encoder = (len(stack.stack_ranges()[0])
               if stack and getattr(c, "is_encoder_decoder", False) and len(stack.stacks) > 1 else 0)
    experts = _first(c, "num_local_experts", "num_experts", "n_routed_experts")
    return ModelInfo(
        name=name, family="hf",
        layers=len(stack.layers) if encoder else _first(c, "num_hidden_layers", "n_layer",  # type: ignore[union-attr]  # encoder > 0: a stack
                                                        default=len(stack.layers) if stack else 0),
        hidden=hidden, heads=heads, kv_heads=_first(c, "num_key_value_heads", default=heads),
        head_dim=head_dim, ffn=_first(c, "intermediate_size", "n_inner", "d_ff", "encoder_ffn_dim",
                                      default=4 * hidden),
        vocab=_first(c, "vocab_size"), experts=experts,
        topk=_first(c, "num_experts_per_tok") if experts else 0,
        moe_ffn=_first(c, "moe_intermediate_size", "intermediate_size") if experts else 0,
        shared_experts=_first(c, "n_shared_experts") if experts else 0,
        dense_layers=_first(c, "first_k_dense_replace") if experts else 0,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        encoder_layers=encoder, sliding_window=_sliding_window(c),
        v_head_dim=v_head_dim if v_head_dim != head_dim else 0,
        kv_lora_rank=_first(c, "kv_lora_rank"), q_lora_rank=_first(c, "q_lora_rank"),
        qk_rope_dim=_first(c, "qk_rope_head_dim") if _first(c, "kv_lora_rank") else 0,
        attention=str(getattr(c, "_attn_implementation", "") or ""),
        notes=(f"HuggingFace {type(model).__name__} (model_type={getattr(c, 'model_type', '?')})",),
    )


def custom_model_info(name: str, model: nn.Module, stack: LayerStack | None) -> ModelInfo:
    """What parameter shapes tell about a plain module; unknown fields stay 0."""
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    token_emb = max(embeddings, key=lambda m: m.num_embeddings, default=None)
    seen: dict[int, str] = {}
    tied = False
    for pname, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen and token_emb is not None and p is token_emb.weight:
            tied = True
        seen.setdefault(id(p), pname)
    experts = max((p.shape[0] for p in model.parameters() if p.dim() >= 3), default=0)
    return ModelInfo(
        name=name, family="custom", layers=len(stack.layers) if stack else 0,
        hidden=token_emb.embedding_dim if token_emb is not None else 0,
        vocab=token_emb.num_embeddings if token_emb is not None else 0,
        experts=experts, tied_embeddings=tied,
    )


def infer_model_info(name: str, model: nn.Module, stack: LayerStack | None) -> ModelInfo:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "model_type"):
        return hf_model_info(name, model, stack)
    return custom_model_info(name, model, stack)


def expert_modules(layer: nn.Module, experts: int) -> tuple[str, ...]:
    """Paths (relative to ``layer``) of modules holding batched expert weights [experts, ...]."""
    if not experts:
        return ()
    return tuple(path for path, m in layer.named_modules()
                 if any(p is not None and p.dim() >= 3 and p.shape[0] == experts
                        for p in m._parameters.values()))
