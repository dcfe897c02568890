"""Perplexity at a context length: evaluation documents, windows over them, and the token-weighted global mean.

For a length L each document is read in windows of L tokens, each window after the ids the tokenizer starts a
sequence with (its BOS when it adds one: :func:`easy_context.models.tokenizer.start_ids`), which count toward L.
``truncate``: one window, the document's first L tokens. Otherwise a sliding window with stride S
(EasyContext's ``--sliding-window``): every token is scored once, with up to L - 1 tokens of left context.
The perplexity is ``exp(sum of all scored token losses / number of scored tokens)`` over every window,
document and rank (sequence-parallel shards and data-parallel shares alike).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from easy_context.eval.forward import loss_sum
from easy_context.eval.runtime import EvalRuntime
from easy_context.loss import all_reduce_count, global_mean_for_logging


def ppl_lengths(min_tokens: int, max_tokens: int, step: int | None) -> list[int]:
    """``range(min, max + 1, step)``, or without ``step`` min, 2 min, 4 min, ... up to max (EasyContext's)."""
    if min_tokens < 2 or max_tokens < min_tokens:
        raise ValueError(f"need 2 <= --min-tokens <= --max-tokens, got {min_tokens}, {max_tokens}")
    if step:
        return list(range(min_tokens, max_tokens + 1, step))
    lengths = [min_tokens]
    while lengths[-1] * 2 <= max_tokens:
        lengths.append(lengths[-1] * 2)
    return lengths


def tokenize_documents(texts: Iterable[str], tokenizer, batch: int = 64) -> list[list[int]]:
    """Token ids of each text (no special tokens)."""
    out: list[list[int]] = []
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            out += tokenizer(chunk, add_special_tokens=False)["input_ids"]
            chunk = []
    if chunk:
        out += tokenizer(chunk, add_special_tokens=False)["input_ids"]
    return [list(ids) for ids in out]


def select_documents(
    docs: list[list[int]],
    concatenate_to: int | None = None,
    separator: int | None = None,
    min_tokens: int | None = None,
    samples: int | None = None,
) -> list[list[int]]:
    """The evaluation samples: optionally the documents joined (``separator`` between) and cut into
    ``concatenate_to``-token pieces (a shorter tail is dropped unless it is all there is), then those with at
    least ``min_tokens`` tokens, then the first ``samples`` of them."""
    if concatenate_to:
        stream: list[int] = []
        for ids in docs:
            stream += ids + ([separator] if separator is not None else [])
        docs = [stream[i : i + concatenate_to] for i in range(0, len(stream), concatenate_to)]
        if len(docs) > 1 and len(docs[-1]) < concatenate_to:
            docs.pop()
    if min_tokens:
        docs = [d for d in docs if len(d) >= min_tokens]
    if samples:
        docs = docs[:samples]
    return docs


@dataclass(frozen=True)
class Window:
    """Document tokens ``[begin, end)`` are read; those at ``score_from`` and later are scored."""

    begin: int
    end: int
    score_from: int


def windows(doc_tokens: int, window: int, stride: int, truncate: bool) -> list[Window]:
    """Windows of ``window`` document tokens: one (``truncate``) or sliding by ``stride`` (at most ``window``)."""
    if window < 1 or stride < 1:
        raise ValueError(f"window ({window}) and stride ({stride}) must be >= 1")
    if truncate:
        return [Window(0, min(window, doc_tokens), 0)]
    stride = min(stride, window)  # a stride longer than the window would skip tokens
    out, scored_to = [], 0
    for begin in range(0, doc_tokens, stride):
        end = min(begin + window, doc_tokens)
        if end > scored_to:
            out.append(Window(begin, end, scored_to))
            scored_to = end
        if end == doc_tokens:
            break
    return out


def window_inputs(doc: list[int], win: Window, lead: list[int]) -> tuple[list[int], list[int]]:
    """(input ids, shifted targets with -100 for unscored positions) of one window, ``lead`` (the start ids) first."""
    ids = lead + doc[win.begin : win.end]
    targets = ids[1:] + [-100]
    for i in range(len(ids) - 1):  # target i is document token win.begin + i + 1 - len(lead)
        if win.begin + i + 1 - len(lead) < win.score_from:
            targets[i] = -100
    return ids, targets


@dataclass
class PplResult:
    tokens: int  # the context length L
    loss: float  # token-weighted mean cross-entropy (nats)
    ppl: float
    scored_tokens: int
    samples: int


def perplexity_at(
    model_with_loss,
    runtime: EvalRuntime,
    docs: list[list[int]],
    length: int,
    stride: int,
    truncate: bool,
    lead: list[int],
    pad_id: int,
    progress=None,
) -> PplResult:
    """Perplexity of ``docs`` at context ``length``, each window after ``lead`` (the tokenizer's start ids, counted in
    ``length``) (collective: every rank calls it with the same docs)."""
    window = length - len(lead)
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for index in runtime.my_share(len(docs)):
        doc = docs[index]
        for win in windows(len(doc), window, stride, truncate):
            ids, targets = window_inputs(doc, win, lead)
            part, n = loss_sum(model_with_loss, runtime, ids, targets, pad_id)
            total += part.double().cpu()
            count += int(n)
        if progress is not None:
            progress.update(1)
    device = runtime.device
    loss = float(global_mean_for_logging(total.to(device), torch.tensor(count, device=device)))
    scored = int(all_reduce_count(count, device=device))
    return PplResult(length, loss, math.exp(min(loss, 700.0)), scored, len(docs))
