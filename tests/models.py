"""Tiny random-init decoder models built from transformers configs (no downloads)."""

from __future__ import annotations

import copy

import torch

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=128, max_position_embeddings=4096)


def tiny_config(model_type: str, heads: int = 4, kv_heads: int = 2, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[model_type]
    extra = {"head_dim": 16} if model_type == "qwen3" else {}
    if model_type == "mistral":
        extra["sliding_window"] = None
    return cls(**{**TINY, **extra, "num_attention_heads": heads, "num_key_value_heads": kv_heads, **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(model_type, **overrides)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    return model.float()
