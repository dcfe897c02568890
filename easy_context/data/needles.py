"""Retrieval rows to mix into a training set: needle documents in the format ``eval_needle.py`` asks about.

A needle document is ``PREFIX + haystack sentences with needles between them + SUFFIX + ANSWER`` (the templates of
:mod:`easy_context.tasks.needle`), with 1..``max_needles`` needles of different cities; the first question is the
eval's, every further one asks for another needle's number in the same words. A retrieval row holds one such
document, EOS-terminated, at a random offset between runs of ordinary text, so questions end at every position
of the row (a document always at the row's end teaches a tiny model a position, not a lookup). The haystack
budget is drawn uniformly up to what the row leaves, so needles sit at every distance the row length allows.

What a retrieval row trains on (``NeedleMix.loss``):
    ``"answer"`` (default): only the answers' tokens (the space and the number after each question); the rest of
        the row is context, as in supervised fine-tuning. Measured (docs/benchmarks.md): with the loss on
        every token, a tiny Llama (hidden 128, 4 layers) trained on 65M tokens of essays + needles never retrieves
        (its answers stay at chance) while the essays' own loss drowns the few answer tokens; with the loss on the
        answers only, the same model retrieves.
    ``"all"``: every token, like the ordinary rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from easy_context.tasks.haystack import Haystack
from easy_context.tasks.needle import ANSWER, CITIES, NEEDLE, PREFIX, QUESTION, SUFFIX, random_number

FOLLOW_UP = "\nQuestion: {question} Answer: The special magic {city} number is:"
MIN_HAYSTACK_TOKENS = 8
LOSSES = ("answer", "all")


@dataclass(frozen=True)
class NeedleMix:
    """Which share of the rows become retrieval rows, what their needles look like, and what they train on."""

    fraction: float  # of the packed rows, 0..1
    digits: int = 7  # of each needle's number (the eval's --rnd_number_digits)
    max_needles: int = 1  # needles, and questions, per document (1..len(CITIES))
    loss: str = "answer"  # "answer": a retrieval row trains on its answers only; "all": on every token

    def __post_init__(self) -> None:
        check_mix("needle", self.fraction, self.loss)
        if self.digits < 1:
            raise ValueError(f"needle digits must be >= 1, got {self.digits}")
        if not 1 <= self.max_needles <= len(CITIES):
            raise ValueError(f"needles per document must be in 1..{len(CITIES)}, got {self.max_needles}")


def check_mix(kind: str, fraction: float, loss: str) -> None:
    """The rules every mix of special rows shares: a share of the rows in [0, 1], a loss of :data:`LOSSES`."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"{kind} fraction must be in [0, 1], got {fraction}")
    if loss not in LOSSES:
        raise ValueError(f"{kind} loss must be one of {', '.join(LOSSES)}, got {loss!r}")


def draw_needles(rng: random.Random, mix: NeedleMix) -> list[tuple[str, str]]:
    """1..``mix.max_needles`` (city, number) pairs, cities distinct."""
    cities = rng.sample(CITIES, rng.randint(1, mix.max_needles))
    return [(city, random_number(rng, mix.digits)) for city in cities]


def needle_text(
    rng: random.Random, sentences: list[str], needles: list[tuple[str, str]]
) -> tuple[str, list[tuple[int, int]]]:
    """One needle document over ``sentences`` (the haystack), ending with the last answer and a period, and the
    character spans of its answers (``" <number>"`` after each question).

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
    size = sum(map(len, pieces))
    spans = []
    for n, i in enumerate(rng.sample(range(count), count)):
        template = SUFFIX if n == 0 else FOLLOW_UP
        question = template.format(question=QUESTION.format(city=cities[i]), city=cities[i])
        answer = ANSWER.format(number=numbers[i])
        spans.append((size + len(question), size + len(question) + len(answer)))
        pieces += [question, answer + "."]
        size += len(question) + len(answer) + 1
    return "".join(pieces), spans


def encode_answers(tokenizer, text: str, spans: list[tuple[int, int]], flag: str = "--needle-loss"
                   ) -> tuple[list[int], list[bool]]:  # fmt: skip
    """Token ids of ``text`` and, per token, whether it lies inside one of ``spans`` (character ranges: the answers
    a row trains on). ``flag``: the option named when the tokenizer has no offsets (a slow tokenizer)."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as e:  # slow (Python) tokenizers have no offsets
        raise ValueError(
            f"rows trained on their answers ({flag} answer) need a fast tokenizer (offsets); use a tokenizers-backed "
            f"one or {flag} all"
        ) from e
    inside = [end > start and any(a <= start and end <= b for a, b in spans) for start, end in enc["offset_mapping"]]
    return enc["input_ids"], inside


def retrieval_row(
    rng: random.Random, haystack: Haystack, tokenizer, row_length: int, filler: np.ndarray, mix: NeedleMix
) -> tuple[np.ndarray, np.ndarray]:
    """``(row_length,)`` int64 ids — ordinary text from ``filler`` (a token stream), one needle document + EOS at a
    random offset, ordinary text again — and ``(row_length,)`` bool: which tokens the row trains on.

    The haystack is a run of ``haystack``'s sentences from a random start, its token budget uniform in
    ``[MIN_HAYSTACK_TOKENS, room]`` where ``room`` is what the row leaves after the document's own words.
    """
    eos = tokenizer.eos_token_id
    needles = draw_needles(rng, mix)

    def encode(sentences: list[str], draws: random.Random = rng) -> tuple[list[int], list[bool]]:
        ids, answer = encode_answers(tokenizer, *needle_text(draws, sentences, needles))
        return ids + [eos], answer + [False]

    probe = random.Random()
    probe.setstate(rng.getstate())
    overhead = len(encode([], probe)[0])  # the document's own words: templates, needles, questions, answers
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
    state = rng.getstate()
    ids, answer = encode(sentences)
    while len(ids) > row_length and sentences:  # joined text can tokenize longer than its parts: trim
        sentences.pop()
        rng.setstate(state)
        ids, answer = encode(sentences)
    ids, answer = ids[-row_length:], answer[-row_length:]
    fill = row_length - len(ids)
    before = rng.randint(0, fill)
    text = [_stream(rng, filler, n) for n in (before, fill - before)]
    trained = np.zeros(row_length, dtype=bool)
    trained[before : before + len(ids)] = answer
    if mix.loss == "all":
        trained[:] = True
    row = np.concatenate([text[0], np.asarray(ids, dtype=np.int64), text[1]])
    return row, trained


def _stream(rng: random.Random, filler: np.ndarray, count: int) -> np.ndarray:
    """``count`` consecutive tokens of ``filler`` from a random start (repeated when it is shorter)."""
    begin = rng.randrange(max(1, len(filler) - count))
    text = filler[begin : begin + count]
    if len(text) < count:
        text = np.resize(filler, count)
    return np.asarray(text, dtype=np.int64)


def mix_retrieval_rows(
    rows: np.ndarray, haystack: Haystack, tokenizer, mix: NeedleMix, seed: int | None = 0
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Replace ``round(mix.fraction * len(rows))`` random rows of ``rows`` (rows, row_length) with retrieval rows.

    The filler text comes from ``rows`` themselves. Returns the new array, a bool array of the same shape saying
    which tokens are trained on (None when every one is), and how many rows were replaced.
    """
    count = round(mix.fraction * len(rows))
    if count == 0:
        return rows, None, 0
    rng = random.Random(f"needles:{seed}")
    chosen = rng.sample(range(len(rows)), count)
    filler = rows.reshape(-1)
    out = rows.copy()
    trained = np.ones(rows.shape, dtype=bool)
    for index in chosen:
        out[index], trained[index] = retrieval_row(rng, haystack, tokenizer, rows.shape[1], filler, mix)
    return out, (None if trained.all() else trained), count
