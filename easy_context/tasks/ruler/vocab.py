"""Words and values for the RULER tasks, all drawn from one seeded ``random.Random``.

As in RULER, needle keys are real adjective-noun pairs ("quizzical-lamp") and the common-words task lists real English
words, both from the word lists that ship inside the ``wonderwords`` wheel (nouns, adjectives, verbs; MIT licensed,
read from the installed package, never downloaded at run time). Values are 7-digit numbers, word pairs or UUIDs;
FWE's coded words are random 6-letter strings; variable names are uppercase letters.
"""

from __future__ import annotations

import functools
import random
import string
import uuid
from importlib import resources

WONDERWORDS_PIN = "wonderwords==3.0.1"
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


@functools.cache
def word_list(kind: str) -> tuple[str, ...]:
    """The wonderwords list ``kind`` ("noun", "adjective" or "verb"), as shipped (one entry per line)."""
    try:
        text = resources.files("wonderwords.assets").joinpath(f"{kind}list.txt").read_text(encoding="utf-8")
    except ModuleNotFoundError:
        raise RuntimeError(
            f"RULER's keys and common words are English words from the wonderwords package: pip install "
            f"{WONDERWORDS_PIN}"
        ) from None
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@functools.cache
def key_pairs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns): a key is one of each joined by a hyphen."""
    return tuple(sorted(set(word_list("adjective")))), tuple(sorted(set(word_list("noun"))))


@functools.cache
def english_words() -> tuple[str, ...]:
    """Nouns, adjectives and verbs, deduplicated and sorted (the common-words task's vocabulary)."""
    return tuple(sorted(set(word_list("noun")) | set(word_list("adjective")) | set(word_list("verb"))))


def made_up_word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    """A lowercase word of ``syllables`` consonant-vowel syllables (sometimes closed by a consonant): the common-words
    list's words once it needs more than the English lists hold."""
    count = rng.randint(*syllables)
    word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(count))
    return word + (rng.choice("nrst") if rng.random() < 0.3 else "")


def distinct(rng: random.Random, make, count: int, avoid: set[str] | None = None) -> list[str]:
    """``count`` distinct values of ``make(rng)``, none in ``avoid`` (which is updated with them)."""
    seen = avoid if avoid is not None else set()
    out: list[str] = []
    while len(out) < count:
        value = make(rng)
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


class LazyDistinct:
    """Distinct ``make(rng)`` values drawn on demand from one RNG: ``lazy[:n]`` is the same prefix for every ``n``
    (a haystack of ``n`` lines is the first ``n`` of one draw, whatever sizes the search tries)."""

    def __init__(self, rng: random.Random, make, avoid: set[str] | None = None):
        self.rng, self.make, self.avoid, self.items = rng, make, avoid if avoid is not None else set(), []

    def __getitem__(self, part: slice) -> list[str]:
        while len(self.items) < part.stop:
            self.items += distinct(self.rng, self.make, max(part.stop - len(self.items), 64), self.avoid)
        return self.items[part]


def key_words(rng: random.Random) -> str:
    """A needle key (or word value) as RULER writes them: an adjective and a noun joined by a hyphen."""
    adjectives, nouns = key_pairs()
    return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"


def number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def uuid_value(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def coded_word(rng: random.Random, letters: int = 6) -> str:
    """FWE's coded word: ``letters`` random lowercase letters."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(letters))


def variable_name(rng: random.Random, letters: int = 5) -> str:
    """Uppercase letters (RULER's variable-tracking names: 5, or 3 in its worked example)."""
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(letters))


KEYS = {"words": key_words, "uuids": uuid_value}
VALUES = {"numbers": number, "words": key_words, "uuids": uuid_value}
