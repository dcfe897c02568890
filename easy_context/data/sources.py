"""Where raw text comes from: ``load_documents(source)`` yields one string per document.

``source`` may be a ``.txt`` file (one document), a ``.jsonl`` file (one document per line, field ``"text"``), a
directory of such files (recursive, sorted), a ``datasets`` ``save_to_disk`` directory (column ``"text"``), or a
Hugging Face hub dataset name (``name`` or ``name:config``, streamed, split ``"train"``, column ``"text"``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

TEXT_FIELD = "text"
FILE_SUFFIXES = (".txt", ".jsonl")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")
_LOCAL_FORMS = "a .txt or .jsonl file, a folder of them, or a datasets save_to_disk folder with a 'text' column"


def is_saved_dataset(path: str) -> bool:
    """True if ``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        return True
    return os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))


def load_saved_dataset(path: str):
    """``datasets.load_from_disk(path)``; a ``DatasetDict`` gives its ``"train"`` split."""
    import datasets

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{path} is a DatasetDict without a 'train' split (splits: {list(ds)})")
        ds = ds["train"]
    return ds


def load_documents(source: str) -> Iterator[str]:
    """Yield the documents of ``source`` (see the module docstring); empty documents are skipped.

    Raises ``FileNotFoundError`` for a missing path, ``ValueError`` for an unusable or empty source.
    """
    source = os.fspath(source)
    count = 0
    for text in _iter_source(source):
        if text:
            count += 1
            yield text
    if count == 0:
        raise ValueError(f"source {source!r} contains no non-empty documents; pass {_LOCAL_FORMS}")


def _iter_source(source: str) -> Iterator[str]:
    if os.path.isdir(source):
        if is_saved_dataset(source):
            yield from _iter_saved(source)
        else:
            files = list_text_files(source)
            if not files:
                raise ValueError(f"folder {source!r} has no .txt or .jsonl files (searched recursively)")
            for path in files:
                yield from _iter_file(path)
    elif os.path.isfile(source):
        yield from _iter_file(source)
    elif _looks_like_hub_name(source):
        yield from _iter_hub(source)
    else:
        raise FileNotFoundError(f"source {source!r} does not exist; pass {_LOCAL_FORMS}, or a hub dataset name")


def list_text_files(folder: str) -> list[str]:
    """All ``.txt``/``.jsonl`` files under ``folder``, recursively, in sorted path order (hidden entries skipped)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if f.endswith(FILE_SUFFIXES) and not f.startswith(".")]
    return sorted(found, key=lambda p: os.path.relpath(p, folder).split(os.sep))


def _iter_file(path: str) -> Iterator[str]:
    if path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            yield f.read()
    elif path.endswith(".jsonl"):
        yield from _iter_jsonl(path)
    else:
        raise ValueError(f"unsupported file {path!r}: expected a .txt or .jsonl file")


def _iter_jsonl(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict) or TEXT_FIELD not in record:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a {TEXT_FIELD!r} field")
            text = record[TEXT_FIELD]
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: field {TEXT_FIELD!r} is {type(text).__name__}, not a string")
            yield text or ""


def _iter_saved(path: str) -> Iterator[str]:
    ds = load_saved_dataset(path)
    if TEXT_FIELD not in ds.column_names:
        raise ValueError(
            f"saved dataset {path!r} has no {TEXT_FIELD!r} column (columns: {ds.column_names}); "
            "a prepared dataset with 'input_ids' is read by load_train_dataset, not load_documents"
        )
    for batch in ds.select_columns([TEXT_FIELD]).iter(batch_size=1024):
        for text in batch[TEXT_FIELD]:
            yield text or ""


def _looks_like_hub_name(source: str) -> bool:
    return bool(_HUB_NAME.match(source)) and not source.endswith((*FILE_SUFFIXES, ".json"))


def _iter_hub(source: str) -> Iterator[str]:
    import datasets

    name, _, config = source.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
        rows = iter(ds)
        first = next(rows, None)
    except Exception as e:  # any hub failure (offline, unknown name, auth) gets the same advice
        offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub is unreachable or the name is wrong"
        raise RuntimeError(
            f"no local file or folder {source!r} exists, and streaming it as a hub dataset failed "
            f"({why}: {type(e).__name__}: {e}). If you are offline, pass a local path instead: {_LOCAL_FORMS} "
            "(e.g. PaulGrahamEssays/ after `python PaulGrahamEssays/fetch.py`)."
        ) from e
    if first is None:
        return
    if TEXT_FIELD not in first:
        raise ValueError(f"hub dataset {source!r} has no {TEXT_FIELD!r} column (columns: {list(first)})")
    yield first[TEXT_FIELD] or ""
    for row in rows:
        yield row[TEXT_FIELD] or ""
