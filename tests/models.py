"""Tiny random-init decoder models built from transformers configs (no downloads)."""

from __future__ import annotations

import copy

import torch

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=128, max_position_embeddings=4096)


# DeepSeek-V3's multi-head latent attention: Q/K heads of 16 + 8 (RoPE) dims, V heads of 16; a small MoE
MLA = dict(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
           moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
           topk_group=1)  # fmt: skip


def tiny_config(model_type: str, heads: int = 4, kv_heads: int = 2, **overrides):
    from transformers import DeepseekV3Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
           "deepseek_v3": DeepseekV3Config}[model_type]  # fmt: skip
    extra = {"head_dim": 16} if model_type == "qwen3" else {}
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
    return model.float()
