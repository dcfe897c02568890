"""Which model a stage's output belongs to: a stage's done marker holds the fingerprint of the model it ran on, so an
output of another model (a miniature's, an earlier MODEL's, a model trained again since) is never taken as done.

The fingerprint is cheap and stable: config.json's bytes and each weight file's name, size and modification time (a
model saved again, converted again or replaced changes it; reading it never does); a GGUF file by its own name, size
and time; a hub id by its name. Packed data belongs to the tokenizer (:func:`tokenizer_fingerprint`), a training run
to the model it started from (:func:`set_aside_other_training`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence

from easy_context.models.source import WEIGHT_SUFFIXES

MODEL_FILES = (*WEIGHT_SUFFIXES, ".gguf")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "spiece.model")
SOURCE_MARKER = "source"  # in a training run's folder: the fingerprint of the model it started from


def _stat_line(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}\n"


def fingerprint(model: str) -> str:
    """16 hex digits that change when the model at ``model`` (a folder, a GGUF file, or a hub id) changes."""
    digest = hashlib.sha256()
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        config = os.path.join(path, "config.json")
        if os.path.isfile(config):
            with open(config, "rb") as f:
                digest.update(f.read())
        for name in sorted(os.listdir(path)):
            if name.endswith(MODEL_FILES):
                digest.update(_stat_line(os.path.join(path, name)).encode())
    elif os.path.isfile(path):
        digest.update(_stat_line(path).encode())
    else:
        digest.update(model.encode())
    return digest.hexdigest()[:16]


def recorded(marker: str) -> str:
    """The fingerprint a done marker holds ('' when it holds none or is missing)."""
    try:
        with open(marker, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def mark_done(marker: str, model: str, tokenizer: bool = False) -> None:
    """Write the done ``marker`` of a stage that ran on ``model`` (``tokenizer``: on its tokenizer only)."""
    os.makedirs(os.path.dirname(marker) or ".", exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        f.write((tokenizer_fingerprint if tokenizer else fingerprint)(model) + "\n")


def done_for(marker: str, model: str, outputs: Sequence[str], log: Callable[[str], None], label: str,
             tokenizer: bool = False) -> bool:  # fmt: skip
    """Whether the stage whose done ``marker`` this is already ran on ``model`` (``tokenizer``: on its tokenizer).
    When it ran on another model (the marker holds another fingerprint or none, e.g. left by an earlier version, while
    the marker or any of ``outputs`` is there), the marker and ``outputs`` are removed and one line is logged: the
    stage runs again."""
    want, have = (tokenizer_fingerprint if tokenizer else fingerprint)(model), recorded(marker)
    if have == want:
        return True
    stale = [p for p in (marker, *outputs) if os.path.lexists(p)]
    if stale:
        was = f"model {have}" if have else "no model recorded"
        log(f"{label}: its results are of another model ({was}; {model} is {want}); running it again")
        for path in stale:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    return False


def tokenizer_fingerprint(model: str) -> str:
    """16 hex digits of the tokenizer files' bytes in the folder ``model`` (what packed data depends on); the model's
    :func:`fingerprint` when it holds none (a GGUF file, a hub id)."""
    path = os.path.expanduser(model)
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    files = [n for n in names if n.startswith("tokenizer") or n in TOKENIZER_FILES]
    if not files:
        return fingerprint(model)
    digest = hashlib.sha256()
    for name in files:
        with open(os.path.join(path, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def set_aside_other_training(out: str, source: str, log: Callable[[str], None], label: str) -> None:
    """Before a training run from ``source`` into ``out``: a folder trained from another model (its ``source``
    marker holds another fingerprint; without one, its saved config.json's shape differs from the source's) is moved to
    OUT.other-model (one log line), so the run starts afresh instead of resuming another model's state; then the
    marker records ``source``."""
    marker = os.path.join(out, SOURCE_MARKER)
    have = recorded(marker)
    other = have != fingerprint(source) if have else _other_shape(out, source)
    if other and os.path.isdir(out):
        aside = out.rstrip(os.sep) + ".other-model"
        if os.path.isdir(aside):
            shutil.rmtree(aside)
        os.replace(out, aside)
        log(f"{label}: {out} was trained from another model than {source}; moved to {aside}, training afresh")
    mark_done(marker, source)


def _other_shape(out: str, source: str) -> bool:
    """Whether the model saved in ``out`` has another shape than ``source``'s (False when either has no config)."""
    from easy_context.models.fetch import SHAPE_KEYS

    configs = []
    for folder in (out, source):
        try:
            with open(os.path.join(os.path.expanduser(folder), "config.json"), encoding="utf-8") as f:
                configs.append(json.load(f))
        except (OSError, ValueError):
            return False
    return any(configs[0].get(k) != configs[1].get(k) for k in SHAPE_KEYS)
