"""A config.json that transformers 4.x and 5.x read alike: the RoPE keys of both, written together.

transformers 5 keeps a model's RoPE in ``rope_parameters`` (one dict, or one per layer type: Gemma 3's
``sliding_attention`` / ``full_attention``). transformers 4.x reads the top-level ``rope_theta``, ``rope_scaling``
(its scaling without the base), ``partial_rotary_factor`` and Gemma 3's ``rope_local_base_freq`` (the sliding
layers' base; ``rope_theta`` and ``rope_scaling`` are the global layers'); finding none, it loads the family's default
base without a word (Llama 10000, Gemma 3's global layers 1e6). Every model folder the project writes goes through
:func:`save_model`, which writes both.

transformers 5 still reads the legacy keys, and they win: a flat ``rope_scaling`` replaces ``rope_parameters``
outright and ``rope_theta`` fills it in (Gemma 3: ``rope_scaling`` updates the global layers' dict). So the legacy
keys are always derived from ``rope_parameters`` when a file is written, never carried over from elsewhere: equal
values make the precedence moot.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"
# rope_parameters keys that transformers 4.x keeps outside rope_scaling
_OUTSIDE_SCALING = ("rope_theta", "partial_rotary_factor")
# model types whose 4.x config names the sliding layers' base apart from rope_theta (the global layers')
LOCAL_BASE_KEYS = {"gemma3_text": "rope_local_base_freq"}
GLOBAL_LAYERS, LOCAL_LAYERS = "full_attention", "sliding_attention"


class LegacyRopeError(ValueError):
    """A RoPE that transformers 4.x's config keys cannot express."""


def _values(config: Any) -> dict[str, Any]:
    """A config's values: a PretrainedConfig's ``to_dict()``, a mapping as it is."""
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def _nested(params: Mapping) -> bool:
    """Whether ``rope_parameters`` holds one dict per layer type (transformers 5's Gemma 3 layout)."""
    return bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())


def _flat_keys(params: Mapping) -> dict[str, Any]:
    """4.x's keys of one RoPE: the base, the scaling (None for plain RoPE), the rotated fraction of a head."""
    out: dict[str, Any] = {}
    if params.get("rope_theta") is not None:
        out["rope_theta"] = float(params["rope_theta"])
    scaling = {k: v for k, v in params.items() if k not in _OUTSIDE_SCALING and k != "type"}
    scaling.setdefault("rope_type", params.get("type", "default"))
    out["rope_scaling"] = scaling if scaling["rope_type"] != "default" else None
    if params.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    return out


def legacy_rope_keys(config: Any) -> dict[str, Any]:
    """The top-level keys transformers 4.x reads for ``config``'s RoPE (a PretrainedConfig or config.json's values),
    with the values of its ``rope_parameters``: ``rope_theta``, ``rope_scaling`` (None when unscaled; else 4.x's
    format: ``rope_type``, ``factor``, ``original_max_position_embeddings``, ... without the base),
    ``partial_rotary_factor`` when set; Gemma 3: ``rope_theta`` / ``rope_scaling`` of the global layers and
    ``rope_local_base_freq`` of the sliding ones. A multimodal config's ``text_config`` gets its own under
    ``"text_config"``. {} without ``rope_parameters``. Raises :class:`LegacyRopeError` for a RoPE 4.x cannot express
    (Gemma 3's sliding layers scaled, per-layer RoPE of another family)."""
    values = _values(config)
    out: dict[str, Any] = {}
    if isinstance(values.get("text_config"), Mapping) and (text := legacy_rope_keys(values["text_config"])):
        out["text_config"] = text
    params = values.get("rope_parameters")
    if not isinstance(params, Mapping) or not params:
        return out
    if not _nested(params):
        return out | _flat_keys(params)
    model_type = values.get("model_type")
    local_key = LOCAL_BASE_KEYS.get(model_type)
    if local_key is not None and params.get(GLOBAL_LAYERS) and params.get(LOCAL_LAYERS):
        local = params[LOCAL_LAYERS]
        if local.get("rope_type", "default") != "default":
            raise LegacyRopeError(
                f"{model_type}: the sliding layers' RoPE is scaled ({local.get('rope_type')}); transformers 4.x "
                "scales only the global layers, so it would load them unscaled"
            )
        return out | _flat_keys(params[GLOBAL_LAYERS]) | {local_key: float(local["rope_theta"])}
    distinct = {json.dumps(p, sort_keys=True) for p in params.values() if p is not None}
    if len(distinct) == 1:  # one RoPE under every layer type: 4.x's flat keys say it all
        return out | _flat_keys(next(p for p in params.values() if p is not None))
    raise LegacyRopeError(
        f"{model_type}: a RoPE per layer type ({', '.join(params)}) that transformers 4.x's config keys cannot express"
    )


def with_legacy_rope_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's ``values`` with :func:`legacy_rope_keys` set (and a ``text_config``'s set in it)."""
    keys = legacy_rope_keys(values)
    out = dict(values)
    text = keys.pop("text_config", None)
    if text is not None:
        out["text_config"] = {**out["text_config"], **text}
    return out | keys


def _config_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path / CONFIG_NAME if path.is_dir() else path


def add_legacy_rope_keys(path: str | os.PathLike) -> dict[str, Any]:
    """Rewrite the config.json at ``path`` (the file or its folder) with the legacy RoPE keys beside its
    ``rope_parameters`` (written aside, then renamed); returns the values written. A RoPE 4.x cannot express leaves
    the file as it is, with a warning that says so."""
    file = _config_file(path)
    values = json.loads(file.read_text())
    try:
        new = with_legacy_rope_keys(values)
    except LegacyRopeError as exc:
        warnings.warn(f"{file}: no transformers 4.x RoPE keys written ({exc}); 4.x loads the family default RoPE, "
                      "transformers 5 the trained one", stacklevel=2)  # fmt: skip
        return values
    fd, temp = tempfile.mkstemp(prefix=".config-", suffix=".json", dir=file.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(new, indent=2, sort_keys=True) + "\n")
        os.chmod(temp, 0o644)  # mkstemp's file is private; config.json is not
        os.replace(temp, file)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return new


def save_model(model: Any, out_dir: str | os.PathLike, **kwargs: Any) -> None:
    """``model.save_pretrained(out_dir, **kwargs)`` (a model or a config), then its config.json given the
    transformers 4.x RoPE keys (:func:`add_legacy_rope_keys`): every model folder the project writes is saved here."""
    model.save_pretrained(out_dir, **kwargs)
    add_legacy_rope_keys(out_dir)
