"""Where a model comes from, decided without loading it: a preset, ``shape:<name>``, a local folder (with or
without weights), a GGUF file, a fetch name, or a hub id (and whether an offline run can reach it). What a name is
is :mod:`easy_context.models.resolve`'s to say; the checks here ask it."""

from __future__ import annotations

import os
import re

from easy_context.models.folders import WEIGHT_SUFFIXES, folder_weights, is_hf_folder  # noqa: F401
from easy_context.models.gguf import gguf_error, is_gguf
from easy_context.models.resolve import fetch_hint, resolve_model


def is_config_only(name: str) -> bool:
    """Whether ``name`` is a local folder with a ``config.json`` and no weight files (safetensors, bin, index)."""
    return folder_weights(name) is False


def is_random_init(name: str) -> bool:
    """Whether ``name`` builds random weights (a preset, a shape: ``shape:<name>`` or a published name such as
    ``llama-3-8b``, a config-only folder or config.json) rather than loading a checkpoint."""
    try:
        return resolve_model(name).random_init
    except ValueError:  # an unknown shape: name is random init; building it says which names exist
        return True


def missing_local_path(name: str, flag: str = "--model") -> str | None:
    """A one-line error when ``name`` is meant as a local folder (starts with ``.``, ``/`` or ``~``, or has more than
    one ``/``) that does not exist, names a GGUF file that is missing or unreadable (``gguf`` not installed,
    truncated, ...), or a fetch name not fetched yet; None otherwise (hub ids look like ``org/name``; presets build
    random weights)."""
    if not name or is_random_init(name):
        return None
    ref = resolve_model(name)
    if ref.kind == "fetch":
        return None if ref.fetched else fetch_hint(ref, flag)
    if is_gguf(name):
        error = gguf_error(name)
        return f"{flag} {error}" if error else None
    if os.path.exists(os.path.expanduser(name)):
        return None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return f"{flag} {name}: no such folder (a local checkpoint path; hub ids look like org/name)"
    return None


_HUB_PART = r"\w(?:[\w.-]{0,94}\w)?"


_HUB_ID = re.compile(rf"(?:{_HUB_PART}/)?{_HUB_PART}")


LOCAL_FOLDER_NAMES = frozenset(
    {"out", "output", "outputs", "checkpoints", "checkpoint", "ckpt", "ckpts", "runs", "run", "results", "saved",
     "save", "tmp", "exp", "exps", "experiments", "logs", "data", "models", "model", "work", "scratch"}
)  # fmt: skip


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (as huggingface_hub reads them)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in names)


def hub_cache_dir() -> str:
    """The hub cache folder, as huggingface_hub resolves it (read at each call): $HF_HUB_CACHE, else the legacy
    $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (default ~/.cache)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    legacy = os.environ.get("HUGGINGFACE_HUB_CACHE")
    return os.path.expanduser(os.environ.get("HF_HUB_CACHE") or legacy or os.path.join(home, "hub"))


def hub_cached(repo_id: str) -> bool:
    """Whether the hub cache holds a snapshot of the model ``repo_id`` (what an offline run can load)."""
    snapshots = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"), "snapshots")
    return os.path.isdir(snapshots) and bool(os.listdir(snapshots))


def model_source_error(name: str | None, flag: str = "--model") -> str | None:
    """A one-line error when ``name`` (a ``--model`` / ``--tokenizer`` value) can be neither a local path nor a hub id,
    decided without the network; None when it is an existing path, a preset, ``shape:<name>``, or a hub id worth
    trying (in the hub cache when offline).

    A name that does not exist here is refused, naming both readings, when it cannot be a hub id (its syntax, or its
    first part is a local folder or a typical output folder such as ``out/``), or when the run is offline and the
    hub cache lacks an ``org/name`` (transformers would fail later, after the tokenizer, with a traceback)."""
    if not name or is_random_init(name):
        return None
    missing = missing_local_path(name, flag)  # paths that only a folder can be (./x, /x, ~/x, a/b/c), GGUF files
    if missing or os.path.exists(os.path.expanduser(name)):
        return missing
    local = f"{flag} {name}: no local folder of that name"
    fix = "train or fetch it first, or pass an existing folder or a hub id org/name"
    if not _HUB_ID.fullmatch(name) or "--" in name or ".." in name:
        return f"{local}, and not a hub id (those look like org/name): {fix}"
    org = name.split("/")[0] if "/" in name else None
    if org is not None and os.path.isdir(org):
        return f"{local} (though {org}/ is one here), so not read as a hub id: {fix}"
    if org is not None and org.lower() in LOCAL_FOLDER_NAMES:
        return f"{local}, and not read as a hub id ({org}/ is an output folder name, not a hub organization): {fix}"
    if org is not None and hub_offline() and not hub_cached(name):  # bare names (gpt2): transformers' own error
        return (f"{local}, and hub model {name} is not in the hub cache (offline: HF_HUB_OFFLINE or "
                "TRANSFORMERS_OFFLINE is set): download it online once, or pass an existing folder")  # fmt: skip
    return None
