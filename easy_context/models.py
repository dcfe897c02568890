"""Load the model to train: a hub id, a local path, or a tiny random-init preset (offline demos and tests)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

# name -> (model_type, config overrides); vocab_size comes from the tokenizer
PRESETS: dict[str, tuple[str, dict]] = {
    "tiny-llama": ("llama", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2)),
    "tiny-mistral": ("mistral", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2)),
    "tiny-qwen3": ("qwen3", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=32)),
}  # fmt: skip


def set_rope_theta(config: PretrainedConfig, theta: float) -> None:
    """Set the RoPE base (transformers 5 keeps it in ``config.rope_parameters``, per layer type for some models)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        params["rope_theta"] = float(theta)
    elif isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        for sub in params.values():
            sub["rope_theta"] = float(theta)
    else:
        config.rope_theta = float(theta)


def get_rope_theta(config: PretrainedConfig) -> float | None:
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        return float(next(iter(params.values()))["rope_theta"])
    return getattr(config, "rope_theta", None)


def build_config(name_or_path: str, vocab_size: int | None = None, rope_theta: float | None = None,
                 max_position_embeddings: int | None = None) -> PretrainedConfig:  # fmt: skip
    """The config of a preset or of a hub/local model, with the requested RoPE base and context size."""
    if name_or_path in PRESETS:
        model_type, overrides = PRESETS[name_or_path]
        if vocab_size is None:
            raise ValueError(f"preset {name_or_path!r} needs a vocab_size (from the tokenizer)")
        config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **overrides)
    else:
        config = AutoConfig.from_pretrained(name_or_path)
    if rope_theta is not None:
        set_rope_theta(config, rope_theta)
    if max_position_embeddings is not None:
        config.max_position_embeddings = max(
            getattr(config, "max_position_embeddings", 0) or 0, max_position_embeddings
        )
    return config


def load_model(
    name_or_path: str,
    vocab_size: int | None = None,
    rope_theta: float | None = None,
    max_position_embeddings: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> PreTrainedModel:
    """A causal LM: preset names build random weights (seeded); anything else loads pretrained weights."""
    config = build_config(name_or_path, vocab_size, rope_theta, max_position_embeddings)
    if name_or_path in PRESETS:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, config=config, dtype=dtype)
    return model
