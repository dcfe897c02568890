"""The tokenizer that goes with a model: a folder, a hub id, or the one a GGUF file carries."""

from __future__ import annotations

import os


def load_tokenizer(name_or_path: str):
    """``AutoTokenizer.from_pretrained(name_or_path)`` with an error that says what to do when it cannot load; a GGUF
    file (``path/model.gguf``) gives the tokenizer in its metadata (:mod:`easy_context.models.gguf`), a fetch name its
    folder's (:func:`easy_context.models.resolve.model_location`)."""
    from transformers import AutoTokenizer

    from easy_context.models.gguf import is_gguf, load_gguf_tokenizer
    from easy_context.models.resolve import model_location

    name_or_path = model_location(name_or_path, "--tokenizer")

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


def start_ids(tokenizer) -> list[int]:
    """The ids ``tokenizer`` puts in front of every sequence it encodes by default: ``[bos]`` for Llama, Mistral and
    Gemma, ``[]`` for SmolLM2 or GPT-2. What a model read at position 0 in pre-training, so what every prompt and
    every training row starts with here."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for i in range(len(full) - len(plain) + 1):  # what precedes the text's own ids (a trailing EOS is not wanted)
        if full[i : i + len(plain)] == plain:
            return list(full[:i])
    return []


def encode(tokenizer, text: str, start: list[int] | None = None) -> list[int]:
    """The ids of ``text`` as a model input: :func:`start_ids` first unless the text already begins with them (a chat
    template that writes ``<bos>`` itself), then the text without special tokens (no EOS). ``start``: the result of
    :func:`start_ids`, passed by callers that encode many texts."""
    return encode_documents(tokenizer, [text], start)[0]


def encode_documents(tokenizer, texts: list[str], start: list[int] | None = None) -> list[list[int]]:
    """Each of ``texts`` as :func:`encode` encodes it (start ids first, once; no EOS), tokenized in one batch: the
    documents a training row is packed from."""
    start = start_ids(tokenizer) if start is None else start
    batch = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [list(ids) if list(ids[: len(start)]) == start else [*start, *ids] for ids in batch]
