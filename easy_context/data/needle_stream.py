"""Needle-retrieval rows mixed into the streamed preparation's rows, one block of rows at a time (the in-memory
path mixes them with :func:`easy_context.data.needles.mix_retrieval_rows`)."""

from __future__ import annotations

import random

import numpy as np

from easy_context.data.needles import retrieval_row


class NeedleStream:
    """Needle-retrieval rows mixed into a stream of rows: of ``total_rows``, exactly ``round(fraction * total)``
    are replaced, each row chosen with probability (still to choose) / (rows left) (selection sampling, O(1)
    memory), their filler text from the rows of the same block."""

    def __init__(self, haystack, tokenizer, mix, seed: int | None, total_rows: int) -> None:
        self.haystack, self.tokenizer, self.mix = haystack, tokenizer, mix
        self.rng = random.Random(f"needles:{seed}")
        self.count = round(mix.fraction * total_rows)
        self.left, self.rows_left = self.count, total_rows

    @property
    def labels(self) -> bool:
        """Whether the output gets a ``labels`` column (needle rows trained on their answers only)."""
        return self.count > 0 and self.mix.loss != "all"

    def apply(self, rows: np.ndarray) -> np.ndarray | None:
        """Replace the chosen rows of ``rows`` (int32, in place); return which tokens train (None: all)."""
        chosen = []
        for i in range(len(rows)):
            if self.left and self.rng.random() * self.rows_left < self.left:
                chosen.append(i)
                self.left -= 1
            self.rows_left -= 1
        if not chosen:
            return None
        filler = rows.reshape(-1)
        trained = np.ones(rows.shape, dtype=bool)
        made = []  # all made before any is written in: the filler text is the block's own rows
        for _ in chosen:
            row, mask = retrieval_row(self.rng, self.haystack, self.tokenizer, rows.shape[1], filler, self.mix)
            made.append((row.astype(np.int32), mask))
        for i, (row, mask) in zip(chosen, made):
            rows[i], trained[i] = row, mask
        return None if trained.all() else trained
