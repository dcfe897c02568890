"""The tokenizer of an exported GGUF file (its ``tokenizer.*`` fields), by one of two routes:

- ``gguf``: copied field by field from the GGUF file the model came from. That is exactly what llama.cpp read before
  (its vocabulary type, pre-tokenizer, scores, token types, chat template): the faithful route for a model fetched as
  GGUF (SmolLM2, Gemma 3), whose HF tokenizer was itself converted from those fields. The source is found by following
  each training run's ``run_config.json`` (``args.model``) back to a ``.gguf`` file or a folder holding ``gguf/*.gguf``
  (what ``easy-context-fetch`` writes), or named with ``--vocab-from FILE.gguf``.
- ``hf``: built from the folder's ``tokenizer.json`` when it is a BPE (byte-level, with merges): llama.cpp's ``gpt2``
  vocabulary (tokens, merges, token types, special ids). Its pre-tokenizer is recorded as ``default``; llama.cpp's
  converter picks a model-specific one by hashing the tokenizer's output, which a new tokenizer does not have.

``auto`` takes the source GGUF when there is one with as many tokens as the model's vocabulary, else ``hf``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from easy_context.extend.lineage import source_gguf


def gguf_vocab_fields(path: str) -> list[tuple[str, Any, Any, Any]]:
    """``(key, value, type, sub_type)`` of every ``tokenizer.*`` field of a GGUF file, as ``GGUFWriter.add_key_value``
    takes them."""
    from gguf import GGUFReader, GGUFValueType

    out = []
    for key, field in GGUFReader(path).fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            out.append((key, field.contents(), vtype, sub))
    return out


def hf_vocab_fields(tokenizer_dir: str, vocab_size: int) -> list[tuple[str, Any, Any, Any]]:
    """llama.cpp's ``gpt2`` vocabulary of the byte-level BPE in ``tokenizer_dir`` (its tokenizer.json), padded with
    unused tokens up to ``vocab_size`` (the embedding's rows)."""
    from gguf import GGUFValueType, TokenType
    from transformers import AutoTokenizer

    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(f"{tokenizer_dir}: no tokenizer.json; pass --vocab-from FILE.gguf (the source model's GGUF)")
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not model.get("merges"):
        raise ValueError(
            f"{path}: a {model.get('type')} tokenizer without merges, not a BPE this export rebuilds; pass "
            "--vocab-from FILE.gguf (the GGUF the model came from)"
        )
    tokens: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types = {i: TokenType.NORMAL for i in tokens}
    for added in spec.get("added_tokens") or []:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED
    if max(tokens) >= vocab_size:
        raise ValueError(f"{path}: token id {max(tokens)} beyond the model's vocab_size {vocab_size}")
    names = [tokens.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    kinds = [int(types.get(i, TokenType.UNUSED)) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    string, u32, array, boolean = GGUFValueType.STRING, GGUFValueType.UINT32, GGUFValueType.ARRAY, GGUFValueType.BOOL
    out = [
        ("tokenizer.ggml.model", "gpt2", string, None),
        ("tokenizer.ggml.pre", "default", string, None),
        ("tokenizer.ggml.tokens", names, array, string),
        ("tokenizer.ggml.token_type", kinds, array, GGUFValueType.INT32),
        ("tokenizer.ggml.merges", merges, array, string),
    ]
    for attr, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                      ("unk", "unknown_token_id")):  # fmt: skip
        token_id = getattr(tok, f"{attr}_token_id", None)
        if token_id in tokens:  # a default special token the tokenizer class adds is not in the model's vocabulary
            out.append((f"tokenizer.ggml.{key}", int(token_id), u32, None))
    probe = tok("a").input_ids
    adds_bos = tok.bos_token_id is not None and bool(probe) and probe[0] == tok.bos_token_id
    out.append(("tokenizer.ggml.add_bos_token", adds_bos, boolean, None))
    if getattr(tok, "chat_template", None):
        out.append(("tokenizer.chat_template", tok.chat_template, string, None))
    return out


def vocab_fields(model_dir: str, vocab_size: int, vocab_from: str = "auto") -> tuple[str, list]:
    """``(route, fields)``: the tokenizer fields of ``model_dir``'s GGUF. ``vocab_from``: ``auto``, ``hf``, or a
    GGUF file to copy them from (its token count must be ``vocab_size``)."""
    if vocab_from == "hf":
        return "hf", hf_vocab_fields(model_dir, vocab_size)
    source = source_gguf(model_dir) if vocab_from == "auto" else vocab_from
    if source is not None:
        if not os.path.isfile(source):
            raise ValueError(f"--vocab-from {source}: no such GGUF file")
        fields = gguf_vocab_fields(source)
        tokens = next((v for k, v, *_ in fields if k == "tokenizer.ggml.tokens"), [])
        if len(tokens) == vocab_size:
            return f"gguf:{source}", fields
        if vocab_from != "auto":
            raise ValueError(
                f"--vocab-from {source}: {len(tokens)} tokens, the model has vocab_size {vocab_size}; name the GGUF "
                "the model came from, or --vocab-from hf"
            )
    return "hf", hf_vocab_fields(model_dir, vocab_size)
