"""Tiny random-init decoder models built from transformers configs (no downloads)."""

from __future__ import annotations

import copy

import torch

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=128, max_position_embeddings=4096)


# DeepSeek-V3's multi-head latent attention: Q/K heads of 16 + 8 (RoPE) dims, V heads of 16; a small MoE
MLA = dict(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
           moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
           topk_group=1)  # fmt: skip


# attention variants (docs/attention_variants.md): a 5-token window is shorter than any rank's chunk in the tests
# (24 tokens on 2 ranks: 12 per rank, zigzag halves of 6); layers alternate sliding / full (gpt-oss: + sinks)
VARIANT_MODELS = {
    "gemma2": dict(head_dim=16, sliding_window=5, attn_logit_softcapping=5.0, final_logit_softcapping=None,
                   query_pre_attn_scalar=16),
    "gemma3_text": dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=16, layer_types=["sliding_attention",
                                                                                             "full_attention"]),
    "gpt_oss": dict(head_dim=16, sliding_window=5, num_local_experts=4, num_experts_per_tok=2),
    "mistral_sliding": dict(sliding_window=5),
}  # fmt: skip


def tiny_config(model_type: str, heads: int = 4, kv_heads: int = 2, **overrides):
    import transformers as tf

    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config,
           "deepseek_v3": tf.DeepseekV3Config, "gemma2": tf.Gemma2Config, "gemma3_text": tf.Gemma3TextConfig,
           "gpt_oss": tf.GptOssConfig, "mistral_sliding": tf.MistralConfig}[model_type]  # fmt: skip
    extra = {"head_dim": 16} if model_type == "qwen3" else dict(VARIANT_MODELS.get(model_type, {}))
    if model_type == "deepseek_v3":
        extra, kv_heads = dict(MLA), heads  # MLA: one K/V head per query head
    if model_type == "mistral":
        extra["sliding_window"] = None
    return cls(**{**TINY, **extra, "num_attention_heads": heads, "num_key_value_heads": kv_heads, **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(model_type, **overrides)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    for name, p in model.named_parameters():
        if name.endswith(".sinks"):  # gpt-oss initialises them near 0; logits of order 1 make them matter
            with torch.no_grad():
                p.normal_()
    return model.float()
