"""Random token rows: the training set of throughput and memory probes, where the tokens do not matter.

``train.py --dataset random`` (1024 rows) or ``--dataset random:ROWS`` trains on rows of ``seq_length + 1`` token
ids drawn uniformly from the vocabulary, the same on every rank (row ``i`` is seeded by ``(seed, i)``), so a
full-size model can be timed or pushed to its longest context without a tokenizer or a corpus.
"""

from __future__ import annotations

import torch

RANDOM_SOURCE = "random"
DEFAULT_ROWS = 1024


def random_source_rows(source: str) -> int | None:
    """Rows asked for by ``random`` / ``random:ROWS``; None for any other source."""
    name, _, rows = source.partition(":")
    if name != RANDOM_SOURCE:
        return None
    if not rows:
        return DEFAULT_ROWS
    if not rows.isdigit() or int(rows) < 1:
        raise ValueError(f"--dataset {source!r}: write random or random:ROWS with ROWS a positive integer")
    return int(rows)


class RandomTokens(torch.utils.data.Dataset):
    """Item ``i``: a LongTensor ``(seq_length + 1,)`` of ids in ``[0, vocab_size)``, a function of (seed, i)."""

    def __init__(self, vocab_size: int, seq_length: int, rows: int = DEFAULT_ROWS, seed: int = 0):
        if vocab_size < 1 or seq_length < 1 or rows < 1:
            raise ValueError(f"RandomTokens needs positive sizes: vocab {vocab_size}, seq {seq_length}, rows {rows}")
        self.vocab_size, self.seq_length, self.rows, self.seed = vocab_size, seq_length, rows, seed

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.rows:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(index))
        return torch.randint(0, self.vocab_size, (self.seq_length + 1,), generator=g)
