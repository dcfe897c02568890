"""Load the model to train: a hub id, a local path, a GGUF file (``path/model.gguf``, dequantized:
:mod:`easy_context.hf.gguf_source`), a tiny random-init preset (offline demos and tests), ``shape:<name>``: a
full-size published architecture (``shape:llama-2-7b``, ``shape:llama-3-8b``, ...) with random weights, or a local
folder holding only a ``config.json`` (a real model's shape without its weights), also with random weights: for
benchmarks and probes (speed and memory do not depend on the weights)."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .hf.gguf_source import gguf_error, is_gguf, load_gguf_config, load_gguf_model
from .plan.shapes import ALIASES, BUILTIN_MODELS, PRESETS  # every model shape, in one place

SHAPE_PREFIX = "shape:"


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".index.json")


def _folder_weights(name: str) -> bool | None:
    """None when ``name`` is not a local folder with a ``config.json``; else whether it holds weight files."""
    path = os.path.expanduser(name)
    if not (os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))):
        return None
    return any(f.endswith(WEIGHT_SUFFIXES) for f in os.listdir(path))


def is_config_only(name: str) -> bool:
    """Whether ``name`` is a local folder with a ``config.json`` and no weight files (safetensors, bin, index)."""
    return _folder_weights(name) is False


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a local checkpoint: a ``config.json`` and weight files."""
    return _folder_weights(path) is True


def is_random_init(name: str) -> bool:
    """Whether ``name`` builds random weights (a preset, ``shape:<name>`` or a config-only folder) rather than
    loading a checkpoint."""
    return name in PRESETS or name.startswith(SHAPE_PREFIX) or is_config_only(name)


def missing_local_path(name: str, flag: str = "--model") -> str | None:
    """A one-line error when ``name`` is meant as a local folder (starts with ``.``, ``/`` or ``~``, or has more than
    one ``/``) that does not exist, or names a GGUF file that is missing or unreadable (``gguf`` not installed,
    truncated, ...); None otherwise (hub ids look like ``org/name``; presets build random weights)."""
    if not name or is_random_init(name):
        return None
    if is_gguf(name):
        error = gguf_error(name)
        return f"{flag} {error}" if error else None
    if os.path.exists(os.path.expanduser(name)):
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


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config (``config.text_config`` of a multimodal model, else ``config`` itself)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def layer_windows(config: PretrainedConfig) -> list[tuple[str, int | None]]:
    """Per layer, ``("full", None)``, ``("sliding", w)`` or ``("chunked", c)``, as transformers builds the masks.

    ``config.sliding_window`` applies to the layers ``config.layer_types`` marks ``"sliding_attention"`` (Gemma 2/3,
    gpt-oss, Qwen2/3 with ``use_sliding_window``), or to every layer of a config without layer types (Mistral,
    Mixtral, Phi-3 with a window set); ``use_sliding_window = False`` turns it off. ``"chunked_attention"`` layers use
    ``config.attention_chunk_size``.
    """
    config = text_config(config)
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    chunk = getattr(config, "attention_chunk_size", None)
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return [("sliding", int(window)) if window else ("full", None)] * n
    out: list[tuple[str, int | None]] = []
    for kind in layer_types[:n]:
        if kind == "sliding_attention" and window:
            out.append(("sliding", int(window)))
        elif kind == "chunked_attention" and chunk:
            out.append(("chunked", int(chunk)))
        else:
            out.append(("full", None))
    return out


def _per_layer_type(params) -> bool:
    """Whether ``config.rope_parameters`` holds one dict per layer type (Gemma 2/3 in transformers 5)."""
    return isinstance(params, dict) and bool(params) and all(isinstance(v, dict) for v in params.values())


def long_range_layer_types(config: PretrainedConfig) -> list[str] | None:
    """The keys of ``config.rope_parameters`` whose RoPE a context extension changes, or None when one RoPE serves
    every layer. Under per-layer-type parameters (Gemma 2/3: ``sliding_attention`` and ``full_attention``) only the
    layers that attend over the whole context: a sliding-window layer never sees a query-key distance beyond its
    window, so its positions stay inside what it was trained on at any length, and changing its base or scaling
    would only move it away from its pretrained behaviour (Gemma 3's own 128K models scale the global layers only).
    Every type counts as long-range when none is named sliding."""
    return _long_range_keys(getattr(config, "rope_parameters", None))


def _long_range_keys(params) -> list[str] | None:
    if not _per_layer_type(params):
        return None
    return [k for k in params if "sliding" not in k] or list(params)


def set_rope_theta(config: PretrainedConfig, theta: float) -> None:
    """Set the RoPE base (transformers 5 keeps it in ``config.rope_parameters``); under per-layer-type parameters the
    long-range layers' base only (:func:`long_range_layer_types`)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        params["rope_theta"] = float(theta)
    elif _per_layer_type(params):
        for layer_type in long_range_layer_types(config):
            params[layer_type]["rope_theta"] = float(theta)
    else:
        config.rope_theta = float(theta)


def _long_range_rope(params) -> dict:
    """The RoPE parameters of the long-range layers: ``params`` itself, or its first long-range layer type's."""
    keys = _long_range_keys(params)
    return params[keys[0]] if keys else params or {}


def get_rope_theta(config: PretrainedConfig) -> float | None:
    """The RoPE base of the layers that see the whole context (the full-attention layers' under per-layer types)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and (params := _long_range_rope(params)) and "rope_theta" in params:
        return float(params["rope_theta"])
    return getattr(config, "rope_theta", None)


def rope_position_limit(config: PretrainedConfig) -> tuple[int | None, str]:
    """The positions ``config``'s RoPE covers and how: ``max_position_embeddings``, or with a RoPE scaling (yarn,
    linear, llama3, longrope) ``factor`` x its original length when that is more (the full-attention layers' under
    per-layer-type parameters); (None, ...) for dynamic NTK, which rescales to any length."""
    limit = getattr(config, "max_position_embeddings", None)
    params = _long_range_rope(getattr(config, "rope_parameters", None))
    kind, factor = params.get("rope_type", "default"), params.get("factor")
    if kind == "dynamic":
        return None, "dynamic NTK scaling rescales to any length"
    if kind in ("yarn", "linear", "llama3", "longrope") and factor:
        original = params.get("original_max_position_embeddings") or limit
        if original and original * factor > (limit or 0):
            return int(original * factor), f"{kind} factor {factor:g} x {original}"
    return limit, f"max_position_embeddings={limit}"


ROPE_SCALING_TYPES = ("yarn", "dynamic", "linear")
_ROPE_SCALING_USAGE = "use TYPE:FACTOR[:ORIGINAL], e.g. yarn:8, yarn:8:8192, dynamic:8, linear:4"


def parse_rope_scaling(text: str, config: PretrainedConfig | None = None) -> dict:
    """A RoPE scaling from a CLI string ``TYPE:FACTOR[:ORIGINAL]``: ``yarn:8`` -> ``{"rope_type": "yarn", "factor":
    8.0}``; ``yarn:8:8192`` adds ``original_max_position_embeddings`` (the trained length; ``dynamic`` too, ``linear``
    has none). Without ORIGINAL, ``config`` (when given) supplies its ``max_position_embeddings``, else
    :func:`set_rope_scaling` does when applying it. A bad string is a one-line ValueError."""
    parts = text.strip().split(":")
    kind = parts[0].strip().lower()
    if kind not in ROPE_SCALING_TYPES or len(parts) not in (2, 3):
        raise ValueError(f"rope scaling {text!r}: {_ROPE_SCALING_USAGE} (types: {', '.join(ROPE_SCALING_TYPES)})")
    try:
        factor = float(parts[1])
    except ValueError:
        raise ValueError(f"rope scaling {text!r}: FACTOR {parts[1]!r} is not a number; {_ROPE_SCALING_USAGE}") from None
    if not factor > 1.0 or factor == float("inf"):
        raise ValueError(f"rope scaling {text!r}: FACTOR must be a number > 1 (how many times longer), got {factor:g}")
    scaling: dict = {"rope_type": kind, "factor": factor}
    if len(parts) == 3:
        if kind == "linear":
            raise ValueError(f"rope scaling {text!r}: linear takes no ORIGINAL length; use linear:FACTOR")
        if not parts[2].strip().isdigit() or int(parts[2]) <= 0:
            raise ValueError(f"rope scaling {text!r}: ORIGINAL {parts[2]!r} must be a positive integer (tokens)")
        scaling["original_max_position_embeddings"] = int(parts[2])
    elif kind != "linear" and config is not None and getattr(config, "max_position_embeddings", None):
        scaling["original_max_position_embeddings"] = int(config.max_position_embeddings)
    return scaling


def set_rope_scaling(config: PretrainedConfig, scaling: dict) -> None:
    """Give ``config`` a RoPE scaling in transformers 5 style: ``config.rope_parameters`` becomes ``scaling`` plus
    the RoPE base in use (``rope_theta`` kept). ``yarn``: ``original_max_position_embeddings`` defaults to the
    config's ``max_position_embeddings``; ``dynamic`` (NTK) scales from ``max_position_embeddings``, so an ORIGINAL
    length sets that. Per-layer-type parameters (Gemma 2/3) scale the long-range layers only
    (:func:`long_range_layer_types`)."""
    scaling = dict(scaling)
    kind = scaling.get("rope_type")
    if kind is None or "factor" not in scaling:
        raise ValueError(
            f"rope scaling {scaling}: needs rope_type and factor, e.g. {{'rope_type': 'yarn', 'factor': 8}}"
        )
    scaling["factor"] = float(scaling["factor"])
    original = scaling.pop("original_max_position_embeddings", None) or config.max_position_embeddings
    if kind == "dynamic":
        config.max_position_embeddings = int(original)
    elif kind != "linear":
        scaling["original_max_position_embeddings"] = int(original)
    params = getattr(config, "rope_parameters", None)
    if _per_layer_type(params):
        for layer_type in long_range_layer_types(config):
            params[layer_type] = {**scaling, "rope_theta": params[layer_type].get("rope_theta", get_rope_theta(config))}
    else:
        config.rope_parameters = {**scaling, "rope_theta": get_rope_theta(config)}


def build_config(name_or_path: str, vocab_size: int | None = None, rope_theta: float | None = None,
                 max_position_embeddings: int | None = None,
                 rope_scaling: dict | None = None) -> PretrainedConfig:  # fmt: skip
    """The config of a preset, ``shape:``, GGUF file or hub/local model, with the requested RoPE base, RoPE scaling
    (:func:`set_rope_scaling`; its original length is the model's own context size) and context size
    (``max_position_embeddings`` only grows; with ``dynamic`` scaling it stays the original length it scales from)."""
    if name_or_path in PRESETS:
        model_type, overrides = PRESETS[name_or_path]
        if vocab_size is None:
            raise ValueError(f"preset {name_or_path!r} needs a vocab_size (from the tokenizer)")
        config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **overrides)
    elif name_or_path.startswith(SHAPE_PREFIX):
        config = shape_config(name_or_path, vocab_size)
    elif is_gguf(name_or_path):
        config = load_gguf_config(name_or_path)
    else:
        config = AutoConfig.from_pretrained(name_or_path)
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
    """A causal LM: presets and ``shape:`` names build random weights (seeded, on the current default device, e.g.
    inside ``with torch.device("cuda"):``); a GGUF file loads dequantized to ``dtype`` (a plain model); anything
    else loads pretrained weights. ``rope_scaling``: e.g. ``{"rope_type": "yarn", "factor": 8.0}``
    (:func:`parse_rope_scaling` reads ``yarn:8``)."""
    config = build_config(name_or_path, vocab_size, rope_theta, max_position_embeddings, rope_scaling)
    if is_random_init(name_or_path):
        if is_config_only(name_or_path):
            warnings.warn(f"{name_or_path} holds a config.json and no weights: random-init weights of its shape "
                          "(for throughput and memory probes; pass a checkpoint folder to train a real model)",
                          stacklevel=2)  # fmt: skip
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    elif is_gguf(name_or_path):
        model = load_gguf_model(name_or_path, dtype, config=config)
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, config=config, dtype=dtype)
    return model


def convert_gguf(name: str, out_dir: str, dtype: torch.dtype = torch.bfloat16, tokenizer: str | None = None,
                 force: bool = False) -> str:  # fmt: skip
    """Write a GGUF file as a plain HF folder ``out_dir`` (safetensors in ``dtype``, config.json, tokenizer files)
    that loads without ``gguf``. ``tokenizer``: a tokenizer name/folder to save instead of the file's own (needed
    when the file has none). Does nothing when ``out_dir`` already holds config.json and weights (``force``
    rewrites); the folder appears complete or not at all (written next to it, then renamed). Returns ``out_dir``."""
    from .data.tokenizer import load_tokenizer

    if not force and is_hf_folder(out_dir):
        return out_dir
    tok = load_tokenizer(tokenizer if tokenizer is not None else name)
    model = load_gguf_model(name, dtype)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    temp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(temp, 0o755)  # mkdtemp makes it private; the folder it becomes should not be
    try:
        model.save_pretrained(temp)
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
