"""Retrieval rows to mix into a training set: needle documents in the format ``eval_needle.py`` asks about.

A needle document is ``PREFIX + haystack sentences with needles between them + SUFFIX + ANSWER`` (the templates of
:mod:`easy_context.eval.needle`), with 1..``max_needles`` needles of different cities; the first question is the
eval's, every further one asks for another needle's number in the same words. A retrieval row holds one such
document, EOS-terminated and ending exactly at the row's end, after a run of ordinary text that fills the row, so
no document is cut by the packing. The haystack budget is drawn uniformly up to what the row leaves, so needles sit
at every distance the row length allows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ..eval.haystack import Haystack
from ..eval.needle import ANSWER, CITIES, NEEDLE, PREFIX, QUESTION, SUFFIX, random_number

FOLLOW_UP = "\nQuestion: {question} Answer: The special magic {city} number is:"
MIN_HAYSTACK_TOKENS = 8


@dataclass(frozen=True)
class NeedleMix:
    """Which share of the rows become retrieval rows, and what their needles look like."""

    fraction: float  # of the packed rows, 0..1
    digits: int = 7  # of each needle's number (the eval's --rnd_number_digits)
    max_needles: int = 1  # needles, and questions, per document (1..len(CITIES))

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"needle fraction must be in [0, 1], got {self.fraction}")
        if self.digits < 1:
            raise ValueError(f"needle digits must be >= 1, got {self.digits}")
        if not 1 <= self.max_needles <= len(CITIES):
            raise ValueError(f"needles per document must be in 1..{len(CITIES)}, got {self.max_needles}")


def draw_needles(rng: random.Random, mix: NeedleMix) -> list[tuple[str, str]]:
    """1..``mix.max_needles`` (city, number) pairs, cities distinct."""
    cities = rng.sample(CITIES, rng.randint(1, mix.max_needles))
    return [(city, random_number(rng, mix.digits)) for city in cities]


def needle_text(rng: random.Random, sentences: list[str], needles: list[tuple[str, str]]) -> str:
    """One needle document over ``sentences`` (the haystack), ending with the last answer and a period.

    Each needle goes to a random sentence boundary; the questions come in random order."""
    count = len(needles)
    cities, numbers = [c for c, _ in needles], [n for _, n in needles]
    at: dict[int, list[int]] = {}
    for i in range(count):
        at.setdefault(rng.randint(0, len(sentences)), []).append(i)
    pieces = [PREFIX]
    for j in range(len(sentences) + 1):
        pieces += [NEEDLE.format(city=cities[i], number=numbers[i]) + " " for i in at.get(j, [])]
        if j < len(sentences):
            pieces.append(sentences[j])
    order = rng.sample(range(count), count)
    for n, i in enumerate(order):
        template = SUFFIX if n == 0 else FOLLOW_UP
        pieces.append(template.format(question=QUESTION.format(city=cities[i]), city=cities[i]))
        pieces.append(ANSWER.format(number=numbers[i]) + ".")
    return "".join(pieces)


def retrieval_row(
    rng: random.Random, haystack: Haystack, tokenizer, row_length: int, filler: np.ndarray, mix: NeedleMix
) -> np.ndarray:
    """``(row_length,)`` int64 ids: ordinary text from ``filler`` (a token stream), then one needle document + EOS.

    The haystack is a run of ``haystack``'s sentences from a random start, its token budget uniform in
    ``[MIN_HAYSTACK_TOKENS, room]`` where ``room`` is what the row leaves after the document's own words.
    """
    eos = tokenizer.eos_token_id
    needles = draw_needles(rng, mix)

    def encode(sentences: list[str], draws: random.Random = rng) -> list[int]:
        return tokenizer(needle_text(draws, sentences, needles), add_special_tokens=False)["input_ids"] + [eos]

    probe = random.Random()
    probe.setstate(rng.getstate())
    overhead = len(encode([], probe))  # the document's own words: templates, needles, questions, answers
    room = row_length - overhead
    if room < MIN_HAYSTACK_TOKENS:
        raise ValueError(
            f"rows of {row_length} tokens cannot hold a needle document of {len(needles)} needle(s) "
            f"({overhead} tokens without haystack); use a longer --seq-length or fewer --needles-per-doc"
        )
    budget = rng.randint(MIN_HAYSTACK_TOKENS, room)
    cumulative = np.concatenate([[0], np.cumsum(haystack.token_lengths)])
    start = rng.randrange(len(haystack.sentences))
    end = int(np.searchsorted(cumulative, cumulative[start] + budget, side="right")) - 1
    sentences = list(haystack.sentences[start:end])
    ids = encode(sentences)
    while len(ids) > row_length and sentences:  # joined text can tokenize longer than its parts: trim
        sentences.pop()
        ids = encode(sentences)
    ids = ids[-row_length:]
    fill = row_length - len(ids)
    begin = rng.randrange(max(1, len(filler) - fill))
    text = filler[begin : begin + fill]
    if len(text) < fill:  # a stream shorter than the row: repeat it
        text = np.resize(filler, fill)
    return np.concatenate([np.asarray(text, dtype=np.int64), np.asarray(ids, dtype=np.int64)])


def mix_retrieval_rows(
    rows: np.ndarray, haystack: Haystack, tokenizer, mix: NeedleMix, seed: int | None = 0
) -> tuple[np.ndarray, int]:
    """Replace ``round(mix.fraction * len(rows))`` random rows of ``rows`` (rows, row_length) with retrieval rows.

    The filler text comes from ``rows`` themselves. Returns the new array and how many rows were replaced.
    """
    count = round(mix.fraction * len(rows))
    if count == 0:
        return rows, 0
    rng = random.Random(f"needles:{seed}")
    chosen = rng.sample(range(len(rows)), count)
    filler = rows.reshape(-1)
    out = rows.copy()
    for index in chosen:
        out[index] = retrieval_row(rng, haystack, tokenizer, rows.shape[1], filler, mix)
    return out, count
