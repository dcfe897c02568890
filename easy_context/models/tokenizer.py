"""The tokenizer that goes with a model: a folder, a hub id, or the one a GGUF file carries."""

from __future__ import annotations

import os


def load_tokenizer(name_or_path: str):
    """``AutoTokenizer.from_pretrained(name_or_path)`` with an error that says what to do when it cannot load; a GGUF
    file (``path/model.gguf``) gives the tokenizer in its metadata (:mod:`easy_context.models.gguf`)."""
    from transformers import AutoTokenizer

    from easy_context.models.gguf import is_gguf, load_gguf_tokenizer

    if is_gguf(name_or_path):
        return load_gguf_tokenizer(name_or_path)  # its errors already say what to do
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except Exception as e:  # offline, unknown name, missing files: one actionable message
        if os.path.isdir(name_or_path):
            hint = f"the folder {name_or_path!r} exists but holds no loadable tokenizer (tokenizer.json etc.)"
        else:
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            hint = "HF_HUB_OFFLINE is set" if offline else "not a local folder, and the hub is unreachable or lacks it"
        raise RuntimeError(
            f"could not load tokenizer {name_or_path!r} ({hint}; {type(e).__name__}: {e}). Pass a local tokenizer "
            "folder, or train one: `python -m easy_context.data --dataset SRC --output DIR --seq-length N "
            "--train-tokenizer 8000` writes DIR/tokenizer."
        ) from e
