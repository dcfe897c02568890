"""Packing: EOS-terminated documents, optionally length-upsampled and shuffled, cut into fixed-length rows.

Each row has ``seq_length + 1`` tokens: the model reads ``row[:-1]`` and is trained to predict ``row[1:]``.

Where the tokenizer starts every sequence with BOS (Llama, Mistral, Gemma; not SmolLM2 or GPT-2), both every
document and every row start with it, as in pre-training: documents are encoded as the tokenizer encodes a sequence
(``BOS text``, then EOS here: :func:`easy_context.models.tokenizer.encode_documents`), and a row that begins inside a
document gets BOS written over its first id (:func:`begin_rows`; that id is context only, never a target). So
position 0 of a row is BOS (a prompt's position 0 at evaluation) -- but for a row cut right after a document's last
token, which starts with that document's EOS and then the next document's BOS (about one row in a mean document
length) -- BOS is never twice in a row, and with ``documents`` packing every document attended on its own starts with
BOS.
Documents flow across row boundaries (no padding); the incomplete tail is dropped. Two packings
(:data:`PACK_MODES`): ``concat`` rows attend across documents (EasyContext's behaviour); ``documents`` rows come with
per-token position ids restarting at 0 at each document (:func:`document_positions`), which transformers and
easy_context's sequence-parallel attention read as document starts (document masking).

Length upsampling follows the long-context data recipe of Fu et al. (2024), "Data Engineering for Scaling Language
Models to 128K Context": keep the source mixture but over-represent long documents, here by repeating every document
with at least ``long_doc_tokens`` tokens ``upsample_factor`` times before the shuffle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

PACK_MODES = {
    "concat": "rows of concatenated documents, attention across documents (EasyContext's behaviour)",
    "documents": "also store position_ids restarting at 0 after each EOS: attention stays inside each document",
}


def document_positions(rows: np.ndarray, eos_id: int, dtype: np.dtype = np.int64) -> np.ndarray:
    """Position ids (same shape as ``rows`` (rows, length)) for document masking: 0 at each row's start and at every
    token after an ``eos_id`` (a document start), else the previous position + 1. A document cut by a row boundary
    continues in the next row from position 0 (it is that row's first document). ``dtype``: of the result (the
    work is done in it, so ``np.int32`` needs about half the memory)."""
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"rows must be (rows, length), got shape {rows.shape}")
    idx = np.broadcast_to(np.arange(rows.shape[1], dtype=dtype), rows.shape)
    starts = np.zeros(rows.shape, dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = rows[:, :-1] == eos_id
    last_start = np.where(starts, idx, np.zeros((), dtype=dtype))
    del starts
    np.maximum.accumulate(last_start, axis=1, out=last_start)
    return np.subtract(idx, last_start, out=last_start)


def begin_rows(rows: np.ndarray, start: list[int], eos_id: int) -> np.ndarray:
    """``rows`` (rows, length), changed in place: ``start`` (the tokenizer's start ids) written over the first ids of
    every row that begins inside a document. A row that already begins with them is left alone, and so is one that
    begins with the previous document's ``eos_id`` right before them (writing there would put BOS twice in a row).
    Returns ``rows``."""
    k = len(start)
    if k and rows.size:
        head = np.asarray(start, dtype=rows.dtype)
        begun = (rows[:, :k] == head).all(axis=1)
        begun |= (rows[:, 0] == eos_id) & (rows[:, 1 : k + 1] == head).all(axis=1)
        rows[~begun, :k] = head
    return rows


@dataclass
class PackStats:
    """What packing did: input documents and tokens (EOS included), after upsampling, and the output."""

    documents: int = 0
    tokens: int = 0
    long_documents: int = 0
    packed_documents: int = 0
    packed_tokens: int = 0
    rows: int = 0
    dropped_tokens: int = 0


def pack_to_array(
    token_lists: Iterable[list[int]],
    seq_length: int,
    eos_id: int,
    long_doc_tokens: int | None = None,
    upsample_factor: int = 1,
    seed: int | None = 0,
) -> tuple[np.ndarray, PackStats]:
    """Like :func:`pack_documents`, but returns an int64 array of shape ``(rows, seq_length + 1)`` and stats."""
    _check_args(seq_length, eos_id, long_doc_tokens, upsample_factor)
    stats = PackStats()
    eos = np.array([eos_id], dtype=np.int64)
    docs: list[np.ndarray] = []
    repeats: list[int] = []
    for ids in token_lists:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        is_long = long_doc_tokens is not None and arr.size >= long_doc_tokens
        docs.append(np.concatenate([arr, eos]))
        repeats.append(upsample_factor if is_long else 1)
        stats.documents += 1
        stats.tokens += arr.size + 1
        stats.long_documents += int(is_long)

    order = np.repeat(np.arange(len(docs)), repeats)
    if seed is not None:
        order = np.random.default_rng(seed).permutation(order)
    stats.packed_documents = int(order.size)
    stats.packed_tokens = int(sum(docs[i].size for i in order))

    row_len = seq_length + 1
    stats.rows = stats.packed_tokens // row_len
    stats.dropped_tokens = stats.packed_tokens - stats.rows * row_len
    if stats.rows == 0:
        return np.zeros((0, row_len), dtype=np.int64), stats
    flat = np.concatenate([docs[i] for i in order])
    return flat[: stats.rows * row_len].reshape(stats.rows, row_len), stats


def pack_documents(
    token_lists: Iterable[list[int]],
    seq_length: int,
    eos_id: int,
    long_doc_tokens: int | None = None,
    upsample_factor: int = 1,
    seed: int | None = 0,
) -> list[list[int]]:
    """Pack tokenized documents into rows of exactly ``seq_length + 1`` token ids.

    Appends ``eos_id`` to every document; repeats documents with ``>= long_doc_tokens`` tokens (EOS not counted)
    ``upsample_factor`` times; shuffles the document order with ``seed`` (``None`` keeps the input order);
    concatenates and cuts into rows, dropping the remainder shorter than a row.
    """
    rows, _ = pack_to_array(token_lists, seq_length, eos_id, long_doc_tokens, upsample_factor, seed)
    return rows.tolist()


def _check_args(seq_length: int, eos_id: int, long_doc_tokens: int | None, upsample_factor: int) -> None:
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    if eos_id is None or eos_id < 0:
        raise ValueError(f"eos_id must be a token id >= 0, got {eos_id}; does the tokenizer define an eos_token?")
    if upsample_factor < 1:
        raise ValueError(f"upsample_factor must be >= 1, got {upsample_factor}")
    if upsample_factor > 1 and long_doc_tokens is None:
        raise ValueError("upsample_factor > 1 needs long_doc_tokens (the length from which a document is upsampled)")
    if long_doc_tokens is not None and long_doc_tokens < 1:
        raise ValueError(f"long_doc_tokens must be >= 1, got {long_doc_tokens}")
