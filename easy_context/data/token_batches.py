"""Tokenizing a stream of documents in bounded batches, in this process or in a pool of them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from easy_context.models.tokenizer import encode_documents


def token_batches(documents: Iterable[str], tokenizer, batch_chars: int, num_proc: int = 1,
                  show_progress: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Yield ``(tokens, lengths)`` per batch of documents (at most ``batch_chars`` characters, one document at
    least): their token ids concatenated (int64, no special tokens) and each document's token count.
    ``num_proc`` > 1 tokenizes in that many processes, at most ``2 * num_proc`` batches in flight."""
    from tqdm.auto import tqdm

    batches = _char_batches(documents, batch_chars)
    with tqdm(desc="tokenizing", unit="doc", disable=not show_progress) as bar:
        if num_proc <= 1:
            for batch in batches:
                bar.update(len(batch))
                yield encode_batch(tokenizer, batch)
            return
        import concurrent.futures
        import multiprocessing

        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with concurrent.futures.ProcessPoolExecutor(num_proc, mp_context=context, initializer=_init_worker,
                                                    initargs=(tokenizer,)) as pool:  # fmt: skip
            pending: list = []
            for batch in itertools.chain(batches, [None]):
                if batch is not None:
                    pending.append((len(batch), pool.submit(_encode_in_worker, batch)))
                while pending and (batch is None or len(pending) >= 2 * num_proc):
                    count, future = pending.pop(0)
                    bar.update(count)
                    yield future.result()


_WORKER_TOKENIZER = None


def _init_worker(tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _encode_in_worker(batch: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_batch(_WORKER_TOKENIZER, batch)


def encode_batch(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` tokenized as documents (:func:`encode_documents`: the tokenizer's start ids first, no EOS): the ids
    concatenated (int64) and the count per text."""
    ids = encode_documents(tokenizer, texts)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    if not lengths.sum():
        return np.zeros(0, dtype=np.int64), lengths
    return np.concatenate([np.asarray(x, dtype=np.int64) for x in ids]), lengths


def _char_batches(documents: Iterable[str], limit: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in documents:
        if batch and size + len(text) > limit:
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch
