"""What a local model folder holds, read from its file names alone: a checkpoint (``config.json`` and weight files),
a config-only folder, or a CPU miniature's random model (:data:`MARKER`). No imports of the package: every module that
asks (fetch, the sources, the extension's miniature) can."""

from __future__ import annotations

import os

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".index.json")
MARKER = "MINIATURE.txt"  # in a miniature's random model folder: easy-context-fetch and the planner never take it


def folder_weights(name: str) -> bool | None:
    """None when ``name`` is not a local folder with a ``config.json``; else whether it holds weight files."""
    path = os.path.expanduser(name)
    if not (os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))):
        return None
    return any(f.endswith(WEIGHT_SUFFIXES) for f in os.listdir(path))


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a local checkpoint: a ``config.json`` and weight files."""
    return folder_weights(path) is True


def write_marker(folder: str) -> None:
    """Mark ``folder`` as holding a miniature's random model (:data:`MARKER`)."""
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
        f.write("A tiny model with random weights, built by a CPU miniature (MICRO=1): not a pretrained model.\n")


def is_miniature(folder: str) -> bool:
    """Whether ``folder`` holds a miniature's random model (:data:`MARKER`)."""
    return os.path.isfile(os.path.join(folder, MARKER))
