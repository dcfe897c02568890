"""The haystack: a folder of .txt files as one text, split into sentences with their token lengths.

Sentence boundaries are found in the *text* (after ``.``, ``!`` or ``?`` plus closing quotes/brackets, before
whitespace), so the needle lands between sentences whatever the tokenizer. Token lengths come from encoding
each sentence on its own; a prompt's real token count is measured again after it is built.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
FETCH_HINT = "run `python PaulGrahamEssays/fetch.py` for the default essays, or pass --haystack_dir DIR with .txt files"


def haystack_files(folder: str) -> list[str]:
    """The .txt files under ``folder`` (recursive, sorted); a clear error when there are none."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"haystack dir {folder!r} does not exist; {FETCH_HINT}")
    found = sorted(
        os.path.join(root, name)
        for root, _, files in os.walk(folder)
        for name in files
        if name.endswith(".txt") and not name.startswith(".")
    )
    if not found:
        raise ValueError(f"haystack dir {folder!r} holds no .txt files; {FETCH_HINT}")
    return found


def read_haystack_text(folder: str) -> str:
    """All .txt files of ``folder`` joined by blank lines; errors if the result is empty."""
    parts = []
    for path in haystack_files(folder):
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        if text:
            parts.append(text)
    if not parts:
        raise ValueError(f"haystack dir {folder!r} holds only empty .txt files; {FETCH_HINT}")
    return "\n\n".join(parts) + "\n"


def split_sentences(text: str) -> list[str]:
    """``text`` cut at sentence ends; each piece keeps its trailing whitespace, so ``"".join`` gives ``text``."""
    pieces, start = [], 0
    for match in _BOUNDARY.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return [p for p in pieces if p]


@dataclass
class Haystack:
    """Sentences (trailing whitespace kept) and their token counts; ``repeats`` > 1 when the text was repeated."""

    sentences: list[str]
    token_lengths: np.ndarray
    repeats: int = 1

    @classmethod
    def from_text(cls, text: str, tokenizer) -> Haystack:
        sentences = split_sentences(text)
        if not sentences:
            raise ValueError("the haystack text is empty")
        lengths = tokenizer(sentences, add_special_tokens=False)["input_ids"]
        return cls(sentences, np.array([len(ids) for ids in lengths], dtype=np.int64))

    @property
    def total_tokens(self) -> int:
        return int(self.token_lengths.sum())

    def repeated_to(self, tokens: int) -> Haystack:
        """This haystack repeated (whole, in order) until it holds at least ``tokens`` tokens."""
        if self.total_tokens >= tokens:
            return self
        times = math.ceil(tokens / max(self.total_tokens, 1))
        return Haystack(self.sentences * times, np.tile(self.token_lengths, times), self.repeats * times)

    def prefix(self, tokens: int) -> tuple[list[str], np.ndarray]:
        """The longest run of leading sentences with at most ``tokens`` tokens, and their token lengths."""
        cumulative = np.cumsum(self.token_lengths)
        count = int(np.searchsorted(cumulative, tokens, side="right"))
        return self.sentences[:count], self.token_lengths[:count]
