"""A transformers config's RoPE as GGUF metadata (llama.cpp's keys) and back: the one table both directions use.

transformers 5 keeps the RoPE in ``config.rope_parameters``: one dict (``rope_type``, ``rope_theta``, ``factor``,
``original_max_position_embeddings``, ...) or, for Gemma 2/3, one per layer type (``sliding_attention``,
``full_attention``). llama.cpp reads, under ``{arch}.``:

- ``rope.freq_base``: the base of the layers that see the whole context (Gemma 3: the global layers);
- ``rope.freq_base_swa``: the sliding-window layers' base (Gemma 3's local layers);
- ``rope.scaling.type`` (``linear`` / ``yarn``), ``rope.scaling.factor``, ``rope.scaling.original_context_length``,
  ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow``: the scaling, which llama.cpp applies to the long-range
  layers only (the sliding ones keep an unscaled RoPE).

transformers' own GGUF loader reads ``rope.freq_base`` only: :func:`apply_rope_metadata` restores the rest when a
GGUF file is imported (:func:`easy_context.models.gguf.load_gguf_config`).
"""

from __future__ import annotations

import math
from typing import Any

from easy_context.models.config import _long_range_keys, _per_layer_type, set_rope_scaling, set_rope_theta

FREQ_BASE, FREQ_BASE_SWA = "rope.freq_base", "rope.freq_base_swa"
SCALING_TYPE, SCALING_FACTOR = "rope.scaling.type", "rope.scaling.factor"
SCALING_ORIGINAL = "rope.scaling.original_context_length"
# transformers' YaRN parameter -> llama.cpp's key
YARN_KEYS = {"beta_fast": "rope.scaling.yarn_beta_fast", "beta_slow": "rope.scaling.yarn_beta_slow"}
SCALINGS = ("linear", "yarn")  # the rope_type values llama.cpp reads as rope.scaling.type (besides "default")


def _split(config) -> tuple[dict, dict | None]:
    """(the long-range layers' RoPE parameters, the sliding layers' or None)."""
    params = getattr(config, "rope_parameters", None) or {}
    if not _per_layer_type(params):
        return dict(params), None
    long_range = _long_range_keys(params)
    sliding = [k for k in params if k not in long_range]
    return dict(params[long_range[0]]), dict(params[sliding[0]]) if sliding else None


def rope_metadata(config) -> dict[str, Any]:
    """The GGUF fields (keys without the ``{arch}.`` prefix) of ``config``'s RoPE, read from ``rope_parameters``.
    A RoPE llama.cpp cannot express (dynamic NTK, llama3, longrope, a scaled sliding layer, a YaRN with its own
    attention factor) is a one-line ValueError."""
    full, sliding = _split(config)
    if "rope_theta" not in full:
        raise ValueError(
            f"config.rope_parameters {config.rope_parameters!r} names no rope_theta; set it in config.json"
        )
    out: dict[str, Any] = {FREQ_BASE: float(full["rope_theta"])}
    if sliding is not None:
        if sliding.get("rope_type", "default") != "default":
            raise ValueError(
                f"the sliding-window layers' RoPE is scaled ({sliding.get('rope_type')}); llama.cpp scales the "
                "long-range layers only: set the sliding layers' rope_type to default"
            )
        out[FREQ_BASE_SWA] = float(sliding["rope_theta"])
    kind = full.get("rope_type", "default")
    if kind == "default":
        return out
    if kind not in SCALINGS:
        raise ValueError(
            f"RoPE scaling {kind!r} has no GGUF form llama.cpp reads (it reads {', '.join(SCALINGS)}); export a model "
            "without it, or with yarn/linear scaling"
        )
    factor = float(full["factor"])
    out[SCALING_TYPE], out[SCALING_FACTOR] = kind, factor
    if kind == "yarn":
        original = full.get("original_max_position_embeddings") or config.max_position_embeddings
        out[SCALING_ORIGINAL] = int(original)
        attention = full.get("attention_factor")
        if attention is not None and not math.isclose(attention, 0.1 * math.log(factor) + 1.0, rel_tol=1e-6):
            raise ValueError(
                f"YaRN attention_factor {attention} differs from the default 0.1 ln(factor) + 1, which llama.cpp "
                "computes itself; drop attention_factor from rope_parameters"
            )
        out.update({key: float(full[name]) for name, key in YARN_KEYS.items() if full.get(name) is not None})
    return out


def apply_rope_metadata(config, fields: dict[str, Any]) -> None:
    """Set ``config``'s RoPE from GGUF fields (keys without the ``{arch}.`` prefix, as :func:`rope_metadata` writes
    them): the long-range base, the sliding layers' base, the scaling."""
    if FREQ_BASE in fields:
        set_rope_theta(config, float(fields[FREQ_BASE]))
    _, sliding = _split(config)
    if FREQ_BASE_SWA in fields and sliding is not None:
        params = config.rope_parameters
        for key in (k for k in params if k not in _long_range_keys(params)):
            params[key]["rope_theta"] = float(fields[FREQ_BASE_SWA])
    kind = fields.get(SCALING_TYPE)
    if kind in SCALINGS:
        scaling: dict[str, Any] = {"rope_type": kind, "factor": float(fields[SCALING_FACTOR])}
        if kind == "yarn" and SCALING_ORIGINAL in fields:
            scaling["original_max_position_embeddings"] = int(fields[SCALING_ORIGINAL])
        set_rope_scaling(config, scaling)
        for name, key in YARN_KEYS.items():
            for params in _long_range_params(config) if key in fields else ():
                params[name] = float(fields[key])


def _long_range_params(config) -> list[dict]:
    params = config.rope_parameters
    keys = _long_range_keys(params)
    return [params[k] for k in keys] if keys else [params]
