"""Which model a stage's output belongs to: a stage's done marker holds the fingerprint of the model it ran on, so an
output of another model (a miniature's, an earlier MODEL's, a model trained again since) is never taken as done.

The fingerprint is cheap and stable: config.json's bytes and each weight file's name, size and modification time (a
model saved again, converted again or replaced changes it; reading it never does); a GGUF file by its own name, size
and time; a hub id by its name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Sequence

from easy_context.models.source import WEIGHT_SUFFIXES

MODEL_FILES = (*WEIGHT_SUFFIXES, ".gguf")


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


def mark_done(marker: str, model: str) -> None:
    """Write the done ``marker`` of a stage that ran on ``model``."""
    os.makedirs(os.path.dirname(marker) or ".", exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        f.write(fingerprint(model) + "\n")


def done_for(marker: str, model: str, outputs: Sequence[str], log: Callable[[str], None], label: str) -> bool:
    """Whether the stage whose done ``marker`` this is already ran on ``model``. When it ran on another model (the
    marker holds another fingerprint or none, e.g. left by an earlier version, while the marker or any of ``outputs``
    is there), the marker and ``outputs`` are removed and one line is logged: the stage runs again."""
    want, have = fingerprint(model), recorded(marker)
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
