"""Needle-in-a-haystack prompts: the "special magic <city> number" needle, distractor cities, a token depth.

A prompt is ``PREFIX + haystack sentences with the needle (and distractors) between two of them + SUFFIX``
and the expected continuation is ``ANSWER`` (" <number>"). The needle goes to the sentence boundary whose
token offset in the haystack is nearest to ``depth`` percent of the haystack's tokens. ``length`` is the
haystack's token budget (EasyContext's meaning): needle, distractors and instructions come on top.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from easy_context.tasks.haystack import Haystack

CITIES = (
    "Singapore", "New York", "London", "Paris", "Tokyo", "Beijing", "Berlin", "Cairo", "Sydney", "Toronto",
    "Mumbai", "Madrid", "Rome", "Seoul", "Lagos", "Lima", "Oslo", "Vienna", "Dublin", "Nairobi", "Jakarta",
    "Bangkok", "Istanbul", "Moscow", "Chicago", "Santiago", "Hanoi", "Lisbon", "Prague", "Athens",
)  # fmt: skip
NEEDLE = "The special magic {city} number is: {number}."
QUESTION = "What is the special magic {city} number?"
PREFIX = "This is a very long story book: <book> "
SUFFIX = "</book>.\nBased on the content of the book, Question: {question} Answer: The special magic {city} number is:"
ANSWER = " {number}"


@dataclass
class NeedleCase:
    """One prompt of the grid and what it should be answered with."""

    length: int
    depth: float  # percent of the haystack's tokens before the needle (requested)
    sample: int
    city: str
    number: str
    prompt: str  # ends right before the answer
    answer: str  # " <number>"
    needle: str
    needle_char: int  # where the needle starts in ``prompt``
    context_span: tuple[int, int]  # the haystack part of ``prompt`` (with needle and distractors)
    boundary: int  # haystack sentences before the needle
    sentences: int  # haystack sentences in the prompt
    distractors: list[tuple[str, str]] = field(default_factory=list)  # (city, number)


def random_number(rng: random.Random, digits: int) -> str:
    """A ``digits``-digit decimal number without a leading zero."""
    if digits < 1:
        raise ValueError(f"--rnd_number_digits must be >= 1, got {digits}")
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def needle_boundary(lengths: np.ndarray, depth: float) -> int:
    """The sentence boundary (0..len(lengths)) whose token offset is nearest to ``depth`` percent of the total."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    target = depth / 100.0 * offsets[-1]
    return int(np.argmin(np.abs(offsets - target)))


def make_case(
    haystack: Haystack,
    length: int,
    depth: float,
    sample: int,
    digits: int = 7,
    num_distractors: int = 0,
    seed: int = 0,
) -> NeedleCase:
    """The prompt of grid cell (length, depth) for ``sample``: deterministic in (seed, sample, length, depth).

    The needle's city and number depend on (seed, sample) only, so one sample asks the same question at every
    cell; distractors (other cities, other numbers) go to random sentence boundaries.
    """
    sample_rng = random.Random(f"needle:{seed}:{sample}")
    city = sample_rng.choice(CITIES)
    number = random_number(sample_rng, digits)
    others = [c for c in CITIES if c != city]
    distractors = []
    for i in range(num_distractors):
        other = random_number(sample_rng, digits)
        while other == number:
            other = random_number(sample_rng, digits)
        distractors.append((others[i % len(others)], other))

    sentences, lengths = haystack.prefix(length)
    boundary = needle_boundary(lengths, depth)
    place_rng = random.Random(f"place:{seed}:{sample}:{length}:{depth}")
    inserts: dict[int, list[str]] = {boundary: [NEEDLE.format(city=city, number=number) + " "]}
    for other_city, other_number in distractors:
        at = place_rng.randint(0, len(sentences))
        inserts.setdefault(at, []).append(NEEDLE.format(city=other_city, number=other_number) + " ")

    needle = NEEDLE.format(city=city, number=number)
    pieces, needle_char = [PREFIX], -1
    size = len(PREFIX)
    for j in range(len(sentences) + 1):
        for text in inserts.get(j, []):
            if j == boundary and needle_char < 0:
                needle_char = size
            pieces.append(text)
            size += len(text)
        if j < len(sentences):
            pieces.append(sentences[j])
            size += len(sentences[j])
    context_span = (len(PREFIX), size)
    pieces.append(SUFFIX.format(question=QUESTION.format(city=city), city=city))
    return NeedleCase(
        length=length, depth=depth, sample=sample, city=city, number=number, prompt="".join(pieces),
        answer=ANSWER.format(number=number), needle=needle, needle_char=needle_char, context_span=context_span,
        boundary=boundary, sentences=len(sentences), distractors=distractors,
    )  # fmt: skip


def context_lengths(min_length: int, max_length: int, interval: int) -> list[int]:
    """EasyContext's lengths: ``range(min, max + 1, interval)``."""
    if min_length < 1 or max_length < min_length or interval < 1:
        raise ValueError(
            f"need 1 <= --min_context_length <= --max_context_length and --context_interval >= 1, got "
            f"{min_length}, {max_length}, {interval}"
        )
    return list(range(min_length, max_length + 1, interval))


def depth_percents(interval: float) -> list[float]:
    """Depths 0, interval, ... up to 100 percent; ``interval`` is a fraction (0.1) or, above 1, a percent (10)."""
    step = interval * 100 if interval <= 1 else interval
    if step <= 0 or step > 100:
        raise ValueError(f"--depth_interval must be in (0, 1] (fraction) or (1, 100] (percent), got {interval}")
    count = int(np.floor(100 / step + 1e-9))
    return [round(i * step, 6) for i in range(count + 1)]
