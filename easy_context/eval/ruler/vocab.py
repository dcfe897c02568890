"""Made-up words and values for the RULER tasks, all drawn from one seeded ``random.Random``.

Words are pronounceable letter strings (consonant-vowel syllables), so the aggregation tasks can hold tens of
thousands of distinct words at 128K tokens with no word list to download, and a model cannot tell "common" from
"rare" words by their spelling. Keys are ``word-word`` pairs as in RULER; values are 7-digit numbers, words or UUIDs.
"""

from __future__ import annotations

import random
import string
import uuid

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def made_up_word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    """A lowercase word of ``syllables`` consonant-vowel syllables (sometimes closed by a consonant)."""
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


def key_words(rng: random.Random) -> str:
    """A needle key as RULER writes them: two words joined by a hyphen."""
    return f"{made_up_word(rng)}-{made_up_word(rng)}"


def number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def uuid_value(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def variable_name(rng: random.Random) -> str:
    """Five uppercase letters (RULER's variable-tracking names)."""
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


KEYS = {"words": key_words, "uuids": uuid_value}
VALUES = {"numbers": number, "words": key_words, "uuids": uuid_value}
