"""Load the model to train: a hub id, a local path, a tiny random-init preset (offline demos and tests), or
``shape:<name>``: a full-size published architecture (``shape:llama-2-7b``, ``shape:llama-3-8b``, ...) with
random weights, for benchmarks (speed and memory do not depend on the weights)."""

from __future__ import annotations

import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .plan.shapes import ALIASES, BUILTIN_MODELS, PRESETS  # every model shape, in one place

SHAPE_PREFIX = "shape:"


def is_random_init(name: str) -> bool:
    """Whether ``name`` builds random weights (a preset or ``shape:<name>``) rather than loading a checkpoint."""
    return name in PRESETS or name.startswith(SHAPE_PREFIX)


def missing_local_path(name: str, flag: str = "--model") -> str | None:
    """A one-line error when ``name`` is meant as a local folder (starts with ``.``, ``/`` or ``~``, or has more than
    one ``/``) that does not exist; None otherwise (hub ids look like ``org/name``; presets build random weights)."""
    if not name or is_random_init(name) or os.path.exists(os.path.expanduser(name)):
        return None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return f"{flag} {name}: no such folder (a local checkpoint path; hub ids look like org/name)"
    return None


def match_special_tokens(model: PreTrainedModel, tokenizer) -> None:
    """Give a random-init model its tokenizer's bos/eos/pad ids (config and generation config): the architecture
    defaults (Llama: bos 1, eos 2) name other tokens of a tokenizer trained here, and generation would stop on them."""
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            setattr(model.config, name, value)
            if getattr(model, "generation_config", None) is not None:
                setattr(model.generation_config, name, value)


def shape_config(name: str, vocab_size: int | None = None) -> PretrainedConfig:
    """The config of ``shape:<name>`` (one of ``easy_context.plan.BUILTIN_MODELS``), vocab as published unless given."""
    key = name.removeprefix(SHAPE_PREFIX).lower()
    key = ALIASES.get(key, key)
    if key not in BUILTIN_MODELS:
        raise ValueError(f"unknown model shape {name!r}; choose one of {[SHAPE_PREFIX + k for k in BUILTIN_MODELS]}")
    overrides = dict(BUILTIN_MODELS[key])
    model_type = overrides.pop("model_type")
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    return AutoConfig.for_model(model_type, **overrides)


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
    elif name_or_path.startswith(SHAPE_PREFIX):
        config = shape_config(name_or_path, vocab_size)
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
    """A causal LM: presets and ``shape:`` names build random weights (seeded, on the current default device, e.g.
    inside ``with torch.device("cuda"):``); anything else loads pretrained weights."""
    config = build_config(name_or_path, vocab_size, rope_theta, max_position_embeddings)
    if is_random_init(name_or_path):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, config=config, dtype=dtype)
    return model
