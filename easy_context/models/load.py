"""Load the model to train: a hub id, a local path, a GGUF file (``path/model.gguf``, dequantized:
:mod:`easy_context.models.gguf`), a tiny random-init preset (offline demos and tests), ``shape:<name>``: a
full-size published architecture (``shape:llama-2-7b``, ``shape:llama-3-8b``, ...) with random weights, or a local
folder holding only a ``config.json`` (a real model's shape without its weights), also with random weights: for
benchmarks and probes (speed and memory do not depend on the weights)."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from easy_context.models.config import set_rope_scaling, set_rope_theta
from easy_context.models.config_compat import save_model
from easy_context.models.gguf import load_gguf_model
from easy_context.models.resolve import SHAPE_PREFIX, model_config, model_location, resolve_model, shape_key
from easy_context.models.shapes import BUILTIN_MODELS, PRESETS
from easy_context.models.source import is_config_only, is_hf_folder


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
    key = shape_key(name)
    if key is None:
        raise ValueError(f"unknown model shape {name!r}; choose one of {[SHAPE_PREFIX + k for k in BUILTIN_MODELS]}")
    return model_config(SHAPE_PREFIX + key, vocab_size)


def build_config(name_or_path: str, vocab_size: int | None = None, rope_theta: float | None = None,
                 max_position_embeddings: int | None = None,
                 rope_scaling: dict | None = None) -> PretrainedConfig:  # fmt: skip
    """The config of any model name (:func:`easy_context.models.resolve.model_config`: a preset, a shape, a GGUF
    file, a folder, a fetch name, a hub id), with the requested RoPE base, RoPE scaling (:func:`set_rope_scaling`;
    its original length is the model's own context size) and context size (``max_position_embeddings`` only grows;
    with ``dynamic`` scaling it stays the original length it scales from)."""
    if name_or_path in PRESETS and vocab_size is None:
        raise ValueError(f"preset {name_or_path!r} needs a vocab_size (from the tokenizer)")
    config = model_config(name_or_path, vocab_size, local_only=False)
    if rope_theta is not None:
        set_rope_theta(config, rope_theta)
    if rope_scaling is not None:
        set_rope_scaling(config, rope_scaling)
    if max_position_embeddings is not None and (rope_scaling or {}).get("rope_type") != "dynamic":
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
    rope_scaling: dict | None = None,
) -> PreTrainedModel:
    """A causal LM: presets, shapes and config-only folders build random weights (seeded, on the current default
    device, e.g. inside ``with torch.device("cuda"):``); a GGUF file loads dequantized to ``dtype`` (a plain model);
    anything else (a fetch name: its folder) loads pretrained weights. ``rope_scaling``: e.g. ``{"rope_type":
    "yarn", "factor": 8.0}`` (:func:`parse_rope_scaling` reads ``yarn:8``)."""
    config = build_config(name_or_path, vocab_size, rope_theta, max_position_embeddings, rope_scaling)
    ref = resolve_model(name_or_path)
    if ref.random_init:
        if is_config_only(name_or_path):
            warnings.warn(f"{name_or_path} holds a config.json and no weights: random-init weights of its shape "
                          "(for throughput and memory probes; pass a checkpoint folder to train a real model)",
                          stacklevel=2)  # fmt: skip
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    elif ref.kind == "gguf":
        model = load_gguf_model(name_or_path, dtype, config=config)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_location(name_or_path), config=config, dtype=dtype)
    return model


def convert_gguf(name: str, out_dir: str, dtype: torch.dtype = torch.bfloat16, tokenizer: str | None = None,
                 force: bool = False) -> str:  # fmt: skip
    """Write a GGUF file as a plain HF folder ``out_dir`` (safetensors in ``dtype``, config.json, tokenizer files)
    that loads without ``gguf``. ``tokenizer``: a tokenizer name/folder to save instead of the file's own (needed
    when the file has none). Does nothing when ``out_dir`` already holds config.json and weights (``force``
    rewrites); the folder appears complete or not at all (written next to it, then renamed). Returns ``out_dir``."""
    from easy_context.models.tokenizer import load_tokenizer

    if not force and is_hf_folder(out_dir):
        return out_dir
    tok = load_tokenizer(tokenizer if tokenizer is not None else name)
    model = load_gguf_model(name, dtype)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    temp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(temp, 0o755)  # mkdtemp makes it private; the folder it becomes should not be
    try:
        save_model(model, temp)
        tok.save_pretrained(temp)
        if os.path.isdir(out_dir):  # force, or a folder without weights: replace what it holds, keep the rest
            for entry in os.listdir(temp):
                target = os.path.join(out_dir, entry)
                if os.path.isdir(target):
                    shutil.rmtree(target)
                os.replace(os.path.join(temp, entry), target)
            os.rmdir(temp)
        else:
            os.replace(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out_dir
