"""Where a trained model came from: each training run's ``run_config.json`` names the model it started from
(``args.model``), so a model folder leads back, run by run, to the base model (a fetched folder, a GGUF file, a hub
id)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
MAX_RUNS = 16  # a longer chain is a loop


class Run(NamedTuple):
    """One training run: its output folder and its recorded flags (``run_config.json``'s ``args``)."""

    folder: str
    args: dict[str, Any]


def _resolve(path: str, relative_to: str) -> str:
    """A recorded path as it exists here: as written (the pipeline's commands run from the checkout's root), else
    relative to the checkout, else to the folder that recorded it."""
    for candidate in (path, str(ROOT / path), os.path.join(relative_to, path)):
        if os.path.exists(candidate):
            return candidate
    return path


def runs(model_dir: str) -> tuple[list[Run], str | None]:
    """(the training runs that made ``model_dir``, first run first; the base model they started from, as recorded,
    or None when ``model_dir`` has no ``run_config.json``)."""
    chain: list[Run] = []
    folder: str | None = model_dir
    while folder is not None and len(chain) < MAX_RUNS:
        record = os.path.join(folder, "run_config.json")
        if not os.path.isfile(record):
            break
        with open(record, encoding="utf-8") as f:
            args = json.load(f).get("args") or {}
        chain.append(Run(folder, args))
        folder = _resolve(args["model"], folder) if args.get("model") else None
    chain.reverse()
    return chain, folder if chain else None


def source_gguf(model_dir: str) -> str | None:
    """The GGUF file the base model of ``model_dir`` came from: the base itself when it is a ``.gguf`` path, else the
    one ``gguf/*.gguf`` in its folder (what ``easy-context-fetch`` leaves there); None otherwise."""
    _, base = runs(model_dir)
    base = base or model_dir
    if base.lower().endswith(".gguf") and os.path.isfile(base):
        return base
    found = sorted(glob.glob(os.path.join(base, "gguf", "*.gguf")))
    return found[0] if len(found) == 1 else None
