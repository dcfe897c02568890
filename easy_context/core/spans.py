"""Where a rank's local rows sit in the global sequence: contiguous runs (:class:`Span`), as a backend's layout
answers them (:meth:`~easy_context.core.seq_algo.SeqAlgo.global_rows`); document masking and sliding windows cut
blocks along them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class Span(NamedTuple):
    """``length`` local rows from local row ``local`` hold global rows ``start .. start + length - 1``."""

    local: int
    start: int
    length: int


def spans_of(global_rows: Sequence[int] | torch.Tensor) -> tuple[Span, ...]:
    """The :class:`Span` runs of a rank's local rows given the global row of each (e.g. a shard of ``arange``)."""
    rows = global_rows.tolist() if isinstance(global_rows, torch.Tensor) else list(global_rows)
    spans: list[Span] = []
    for i, g in enumerate(rows):
        if spans and spans[-1].start + spans[-1].length == g:
            spans[-1] = spans[-1]._replace(length=spans[-1].length + 1)
        else:
            spans.append(Span(i, g, 1))
    return tuple(spans)


def restrict(spans: Sequence[Span], first: int, count: int) -> tuple[Span, ...]:
    """The spans of local rows ``first .. first + count - 1`` of ``spans``, renumbered to start at local row 0."""
    out = []
    for sp in spans:
        lo, hi = max(sp.local, first), min(sp.local + sp.length, first + count)
        if lo < hi:
            out.append(Span(lo - first, sp.start + lo - sp.local, hi - lo))
    return tuple(out)


def pieces(rows: slice, spans: Sequence[Span]) -> list[Span]:
    """The spans covering local ``rows`` (a slice with a start and a stop)."""
    out = []
    for sp in spans:
        lo, hi = max(sp.local, rows.start), min(sp.local + sp.length, rows.stop)
        if lo < hi:
            out.append(Span(lo, sp.start + lo - sp.local, hi - lo))
    return out
