"""What both preparation paths (in memory: ``prepare.py``, streamed: ``streaming.py``) share: the column names of a
prepared dataset and the text they keep as the needle rows' haystack."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LABELS = "labels"  # the row's ids with -100 where it is not trained on (needle / recall rows trained on answers)
HAYSTACK_CHARS = 16_000_000  # text kept in memory as the needle haystack


def keep_text(documents: Iterable[str], kept: list[str], limit: int) -> Iterator[str]:
    """Yield ``documents`` unchanged, appending them to ``kept`` until ``limit`` characters are kept."""
    size = 0
    for text in documents:
        if size < limit:
            kept.append(text)
            size += len(text)
        yield text
