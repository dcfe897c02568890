"""What a model's config says about long context: the text config, which layers slide (and over which window),
the RoPE base and scaling of the long-range layers, and the longest position the RoPE was set up for."""

from __future__ import annotations

from transformers import PretrainedConfig


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
