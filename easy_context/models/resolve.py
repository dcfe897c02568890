"""One reading of a model name for every command that takes one (``python -m easy_context.plan``, ``python -m
easy_context.extend``, train.py, bench/train_step.py, the eval scripts): :func:`resolve_model` says what a name is,
:func:`model_config` gives its config without weights, :func:`model_location` what a loader opens.

In this order, a name is:

- a preset (``tiny-llama``, ...: random weights, vocabulary from the tokenizer);
- ``shape:<name>``: a published architecture with random weights (``shape:llama-3-8b``; aliases allowed);
- an existing path: a GGUF file (or a folder holding one), a folder with config.json and weights, a folder with only
  config.json or a config.json file (that shape, random weights);
- a name ``easy-context-fetch --list`` prints (``gemma3-270m``): the folder fetch writes (its config as shipped
  with the source before it is fetched; a loader needs it fetched);
- a published architecture without ``shape:`` (``llama-3-8b``, ``Llama-2-7b-hf``): the same as with it;
- else a hub id (``org/name``); its config comes from the hub cache, else the published shape of the same name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from easy_context.models.catalog import SOURCES, find_source, holds
from easy_context.models.gguf import is_gguf
from easy_context.models.shapes import ALIASES, BUILTIN_MODELS, PRESETS, ModelShape

SHAPE_PREFIX = "shape:"
PRESET_VOCAB = 32000  # a preset's vocabulary when no tokenizer gives one (the planner's assumption)
_SHAPE_SUFFIXES = ("-hf", "-instruct", "-chat")
# every command's --model help: the names resolve_model reads
MODEL_HELP = (
    "a model folder or its config.json, a GGUF file, a fetch name (easy-context-fetch --list), a preset "
    "(tiny-llama, ...), a published shape (shape:llama-3-8b or llama-3-8b: random weights), or a hub id"
)
KINDS = ("preset", "shape", "gguf", "folder", "config", "fetch", "hub")
RANDOM_INIT_KINDS = ("preset", "shape", "config")


@dataclass(frozen=True)
class ModelRef:
    """What a model name is (:func:`resolve_model`)."""

    spec: str  # as given
    kind: str  # one of KINDS
    name: str  # the preset / shape key / fetch name, the path, or the hub id
    path: str | None = None  # the local file or folder (a fetch name's, fetched or not)
    shape: str | None = None  # a hub id's published shape (its config when the hub cache lacks it)

    @property
    def random_init(self) -> bool:
        """Whether loading it builds random weights (a preset, a shape, a config without weights)."""
        return self.kind in RANDOM_INIT_KINDS

    @property
    def fetched(self) -> bool:
        """For a fetch name: whether its folder holds the converted model."""
        return self.kind == "fetch" and _has_weights(self.path)


def _has_weights(path: str | None) -> bool:
    from easy_context.models.folders import is_hf_folder

    return path is not None and is_hf_folder(path)


def shape_key(name: str) -> str | None:
    """The :data:`BUILTIN_MODELS` key ``name`` spells (``shape:`` prefix, case, an ``org/`` part, ``-hf`` /
    ``-instruct`` / ``-chat`` suffixes and the aliases allowed), else None."""
    key = name.lower().removeprefix(SHAPE_PREFIX).rstrip("/").split("/")[-1]
    for suffix in _SHAPE_SUFFIXES:
        key = key.removesuffix(suffix)
    key = ALIASES.get(key, key)
    return key if key in BUILTIN_MODELS else None


def known_names() -> str:
    """The names that need no path, for error messages."""
    return (f"presets {', '.join(PRESETS)}; shapes {', '.join(SHAPE_PREFIX + k for k in BUILTIN_MODELS)}; "
            f"fetch names {', '.join(s.name for s in SOURCES)}")  # fmt: skip


def resolve_model(spec: str) -> ModelRef:
    """What ``spec`` names (the module's docstring lists the readings, in order); decided without loading anything.
    An unknown ``shape:`` name is a one-line ValueError listing the known ones."""
    if spec in PRESETS:
        return ModelRef(spec, "preset", spec)
    if spec.startswith(SHAPE_PREFIX):
        key = shape_key(spec)
        if key is None:
            known = [SHAPE_PREFIX + k for k in BUILTIN_MODELS]
            raise ValueError(f"unknown model shape {spec!r}; choose one of {known}")
        return ModelRef(spec, "shape", key)
    path = os.path.expanduser(spec)
    if is_gguf(spec):
        return ModelRef(spec, "gguf", spec, path)
    if os.path.isfile(path) and os.path.basename(path) == "config.json":
        return ModelRef(spec, "config", spec, os.path.dirname(path) or ".")
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return ModelRef(spec, "folder" if _has_weights(path) else "config", spec, path)
    source = find_source(spec) if not os.path.exists(path) else None
    if source is not None:
        return ModelRef(spec, "fetch", spec, source.default_dest)
    key = shape_key(spec)
    if key is not None and "/" not in spec:
        return ModelRef(spec, "shape", key)
    return ModelRef(spec, "hub", spec, shape=key)


def model_config(spec: str | ModelRef, vocab_size: int | None = None, local_only: bool = True):
    """The config of any model name, without its weights: a preset's (vocabulary ``vocab_size``, else
    :data:`PRESET_VOCAB`), a shape's as published (``vocab_size`` overrides), a folder's or config.json's, a GGUF
    file's, a fetch name's (its folder once it holds the source's model, else the config shipped with the source), a
    hub id's from the hub cache, else (``local_only``) its published shape; ``local_only=False`` (a loader):
    downloaded when online, never a stand-in. A name none of these serve is a one-line ValueError that says what
    would."""
    from transformers import AutoConfig

    ref = spec if isinstance(spec, ModelRef) else resolve_model(spec)
    if ref.kind == "preset":
        model_type, overrides = PRESETS[ref.name]
        return AutoConfig.for_model(model_type, **{"vocab_size": vocab_size or PRESET_VOCAB, **overrides})
    if ref.kind == "shape":
        values = dict(BUILTIN_MODELS[ref.name], **({"vocab_size": vocab_size} if vocab_size else {}))
        return AutoConfig.for_model(values.pop("model_type"), **values)
    if ref.kind == "gguf":
        from easy_context.models.gguf import load_gguf_config

        return load_gguf_config(ref.path)
    if ref.kind in ("folder", "config"):
        return AutoConfig.from_pretrained(ref.path)
    if ref.kind == "fetch":
        if holds(ref.name, ref.path):  # never a miniature's or another model's folder
            return AutoConfig.from_pretrained(ref.path)
        values = dict(find_source(ref.name).config)
        return AutoConfig.for_model(values.pop("model_type"), **values)
    try:
        return AutoConfig.from_pretrained(ref.name, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        if ref.shape is not None and local_only:  # a plan needs the shape only; a loader needs the real config
            return model_config(ModelRef(ref.spec, "shape", ref.shape), vocab_size)
        where = "the local hub cache" if local_only else "the hub"
        cause = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"unknown model {ref.spec!r}: no such local path, and not in {where} "
                         f"({exc.__class__.__name__}: {cause}); give a model folder or config.json, a GGUF file, "
                         f"or one of: {known_names()}") from None  # fmt: skip


def fetch_hint(ref: ModelRef, flag: str = "--model") -> str:
    """The one-line error for a fetch name whose folder holds no model yet."""
    return (f"{flag} {ref.spec}: not fetched yet ({ref.path} holds no model); fix: easy-context-fetch {ref.spec} "
            f"(writes {ref.path})")  # fmt: skip


def model_location(spec: str, flag: str = "--model") -> str:
    """What a loader opens for ``spec``: a fetch name's folder (a one-line ValueError naming the fetch command when
    it is not fetched yet), else ``spec`` itself."""
    ref = resolve_model(spec)
    if ref.kind != "fetch":
        return spec
    if not ref.fetched:
        raise ValueError(fetch_hint(ref, flag))
    return ref.path


def load_model_shape(spec: str, vocab_size: int | None = None) -> ModelShape:
    """The shape of any model name the commands take (:func:`easy_context.models.resolve.model_config`): a
    config.json path or a folder holding one, a preset, a published shape (``shape:`` prefix allowed), a fetch name,
    a GGUF file, or a hub id (the hub cache, else its published shape; never downloads). ``vocab_size`` overrides the
    vocabulary. An unknown name is a one-line ValueError listing the known ones."""
    ref = resolve_model(spec)
    values = model_config(ref, vocab_size).to_dict()
    if vocab_size:
        values["vocab_size"] = vocab_size
        if isinstance(values.get("text_config"), dict):
            values["text_config"]["vocab_size"] = vocab_size
    return ModelShape.from_config(ref.name if ref.kind in ("preset", "shape") else spec, values)
