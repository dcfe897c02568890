"""Encoding text the way the tokenizer itself would for a model input: its BOS (if it adds one), no EOS."""

from __future__ import annotations

import sys


def adds_bos(tokenizer) -> bool:
    """True when the tokenizer puts its BOS token in front of encoded text by default (Llama, Mistral, ...)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == bos


def encode(tokenizer, text: str, bos: bool) -> list[int]:
    """Token ids of ``text`` without special tokens, with ``tokenizer.bos_token_id`` in front when ``bos``."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids] if bos else list(ids)


def unlimited(tokenizer):
    """Silence "sequence longer than the model maximum" warnings: long inputs are the point of these evals."""
    tokenizer.model_max_length = sys.maxsize
    return tokenizer


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
