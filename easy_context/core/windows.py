"""Sliding-window attention: the blocks a window keeps, cuts (a band) or drops, in every backend.

The convention is transformers' (``masking_utils.sliding_window_overlay``, eager and sdpa): with
``sliding_window = w`` a query at global position i sees the keys j with ``i - w < j <= i`` (itself and the w - 1
before it; flash-attention's ``window_size = (w - 1, 0)``). Only causal attention has a window here.

Like document masking (:mod:`easy_context.core.documents`) it is a per-block rule on global rows: every block a schedule
computes maps its local rows to contiguous global runs (:class:`~easy_context.core.spans.Span`), and
:func:`window_blocks` turns each (query run x key run) piece into

* nothing, when every key is more than w - 1 rows before every query (a ring step or a DistFlashAttn task beyond the
  window makes no kernel call);
* the piece unchanged, when every key is within the window (no mask: the fast kernel path);
* a band block (:attr:`~easy_context.core.block.Block.band`), trimmed to the query rows that have a key in it and
  the key rows some query sees, so every query row of a band block has at least one key;
* for a causal diagonal piece longer than the window: one causal band block ``(0, w - 1)``. A kernel that skips the
  tiles outside a band (flash-attn-4's window) computes it in one call, ~n w work; for the others
  (:func:`tile_bands`, applied by :mod:`easy_context.core.blockwise`) it becomes diagonal tiles of
  ``max(w, MIN_TILE)`` rows and, below each, the band against the previous tile: ~1.5 n w work, block memory
  O(tile^2).

Exact with every kernel that computes band blocks (``cpu``, ``math``), forward and backward: the backward gets the
final merged out/LSE of the rows, as for any block.
"""

from __future__ import annotations

from collections.abc import Sequence

from easy_context.core.block import Block
from easy_context.core.spans import Span, pieces

MIN_TILE = 32  # diagonal tiles of at least this many rows (a 1-token window would otherwise make one call per row)


def check_window(algo: str, window: int | None, causal: bool) -> int | None:
    """The window as an int (None: no window); ``ValueError`` / ``NotImplementedError`` for what is not supported."""
    if window is None:
        return None
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"{algo}: sliding_window must be a positive int (keys i - w < j <= i), got {window!r}")
    if not causal:
        raise NotImplementedError(
            f"{algo}: a sliding window with non-causal (bidirectional) attention is not supported; only causal "
            "sliding-window layers are"
        )
    return int(window)


def _pair(q: Span, k: Span, w: int, blk: Block) -> list[Block]:
    """The block of query run ``q`` against key run ``k`` (not the same diagonal run) under window ``w``."""
    qa, qb, ka, kb = q.start, q.start + q.length, k.start, k.start + k.length
    if qa - (kb - 1) > w - 1 or qb - 1 < ka:  # every key beyond the window, or after every query
        return []
    if qa - (kb - 1) >= 0 and (qb - 1) - ka <= w - 1:  # every key in the window
        return [Block(slice(q.local, q.local + q.length), slice(k.local, k.local + k.length), False, blk.batch)]
    qa2, qb2 = max(qa, ka), min(qb, kb - 1 + w)  # queries with a key in the window
    ka2, kb2 = max(ka, qa - w + 1), min(kb, qb)  # keys some query sees
    d = qa2 - ka2
    rows = slice(q.local + qa2 - qa, q.local + qb2 - qa)
    keys = slice(k.local + ka2 - ka, k.local + kb2 - ka)
    return [Block(rows, keys, False, blk.batch, (-d, w - 1 - d))]


def _diagonal(q: Span, w: int, blk: Block) -> list[Block]:
    """A causal diagonal run under window ``w``: itself when it fits, else one causal band block (tiled later for
    kernels that would compute its whole triangle: :func:`tile_bands`)."""
    rows = slice(q.local, q.local + q.length)
    return [Block(rows, rows, True, blk.batch, None if q.length <= w else (0, w - 1))]


def tile_bands(blocks: Sequence[Block]) -> list[Block]:
    """``blocks`` with every causal band block longer than its window split into diagonal tiles of
    ``max(w, MIN_TILE)`` rows and the band below each (tiles further back are beyond the window): the same keys,
    ~1.5 n w work and O(tile^2) memory for kernels that mask a block instead of skipping its tiles
    (:attr:`~easy_context.kernels.base.AttnKernel.skips_band_tiles` False)."""
    out: list[Block] = []
    for blk in blocks:
        n = blk.q_rows.stop - blk.q_rows.start
        if not (blk.causal and blk.band is not None and blk.band[0] == 0 and n > max(blk.band[1] + 1, MIN_TILE)):
            out.append(blk)
            continue
        w, first_row = blk.band[1] + 1, blk.q_rows.start
        tile, prev = max(w, MIN_TILE), None
        for first in range(0, n, tile):
            cur = Span(first_row + first, first, min(tile, n - first))
            rows = slice(cur.local, cur.local + cur.length)
            out.append(Block(rows, rows, True, blk.batch, None if cur.length <= w else (0, w - 1)))
            if prev is not None:
                out.extend(_pair(cur, prev, w, blk))
            prev = cur
    return out


def window_blocks(blocks: Sequence[Block], q_spans: Sequence[Span], k_spans: Sequence[Span], window: int | None):
    """The blocks of ``blocks`` a causal sliding window of ``window`` keys keeps (``blocks`` itself when None).

    ``q_spans`` / ``k_spans``: the global rows of the local query / key tensor's rows, as for
    :func:`easy_context.core.documents.split_blocks` (which calls this after its document split). A block wholly inside
    the window is returned unchanged; one wholly outside gives nothing.
    """
    if window is None:
        return list(blocks)
    out: list[Block] = []
    for blk in blocks:
        qp, kp = pieces(blk.q_rows, q_spans), pieces(blk.k_rows, k_spans)
        if not qp or not kp:
            continue
        if max(p.start + p.length for p in qp) - 1 - min(p.start for p in kp) <= window - 1:
            out.append(blk)  # every (query, key) distance is within the window
            continue
        for q in qp:
            for k in kp:
                out.extend(_diagonal(q, window, blk) if blk.causal and q == k else _pair(q, k, window, blk))
    return out
