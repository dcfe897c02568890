"""Retrieval (``niah_*``): needles ``One of the special magic {kind} for {key} is: {value}.`` hidden in a haystack
of noise lines, of other needles (one a line) or of essay text (at sentence starts, at RULER's 40 depths)."""

from __future__ import annotations

import random

from easy_context.tasks.ruler.tasks import Render, RulerTask
from easy_context.tasks.ruler.vocab import KEYS, VALUES, LazyDistinct, distinct

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEPTHS = tuple(round(i * 100 / 39) for i in range(40))  # the essay needles' depths in percent: 40 from 0 to 100

NIAH_NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_PROMPT = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for {query} mentioned in the provided "
    "text?"
)
NIAH_ANSWER = " The special magic {kind} for {query} mentioned in the provided text are"
NIAH_PROMPT_ONE = (
    "A special magic {kind} is hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {kind} afterwards.\n{context}\nWhat is the special magic {kind} for {query} mentioned in the provided text?"
)
NIAH_ANSWER_ONE = " The special magic {kind} for {query} mentioned in the provided text is"


def _join_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def _sentence_start(units: list[str], at: int, reach: int = 64) -> int:
    """The nearest index ``<= at`` (within ``reach``) where a sentence starts, else ``at``."""
    for j in range(at, max(at - reach, 0) - 1, -1):
        if j == 0 or units[j - 1].endswith((".", "?", "!")):
            return j
    return at


def _insert(units: list[str], inserts: list[tuple[float, str]], sep: str, snap: bool = False) -> str:
    """``units`` joined by ``sep`` with each ``(depth, text)`` placed at that fraction of them, in the given order
    where two land at one place (``snap``: moved back to a sentence start, so a needle never splits a sentence)."""
    places: dict[int, list[str]] = {}
    for depth, text in inserts:
        at = min(int(depth * (len(units) + 1)), len(units))
        places.setdefault(_sentence_start(units, at) if snap else at, []).append(text)
    out: list[str] = []
    for j in range(len(units) + 1):
        out += places.get(j, [])
        if j < len(units):
            out.append(units[j])
    return sep.join(out)


def niah(task: RulerTask, rng: random.Random, essay_words: list[str]) -> Render:
    used: set[str] = set()
    keys = distinct(rng, KEYS[task.keys], task.num_keys, used)
    values = {key: distinct(rng, VALUES[task.values], task.num_values, used) for key in keys}
    needles = [NIAH_NEEDLE.format(kind=task.values, key=key, value=v) for key in keys for v in values[key]]
    rng.shuffle(needles)
    if task.haystack == "essay":  # at RULER's depths (percent of the essay), each needle its own
        depths = [d / 100 for d in sorted(rng.sample(DEPTHS, len(needles)))]
    else:
        depths = [rng.random() for _ in needles]
    asked = keys[: task.num_queries]
    answers = [v for key in asked for v in values[key]]
    query = _join_list(asked)
    kind = task.values[:-1] if task.singular else task.values
    prompt, answer = (NIAH_PROMPT_ONE, NIAH_ANSWER_ONE) if task.singular else (NIAH_PROMPT, NIAH_ANSWER)
    filler = LazyDistinct(random.Random(rng.random()), lambda r: NIAH_NEEDLE.format(
        kind=task.values, key=KEYS[task.keys](r), value=VALUES[task.values](r)), used)  # fmt: skip

    def render(n: int) -> tuple[str, str, list[str]]:
        if task.haystack == "essay":
            units = [essay_words[i % len(essay_words)] for i in range(n)]
            context = _insert(units, list(zip(depths, needles)), " ", snap=True)
        else:
            units = [NOISE] * n if task.haystack == "noise" else filler[:n]
            context = _insert(units, list(zip(depths, needles)), "\n")
        return prompt.format(kind=kind, context=context, query=query), answer.format(kind=kind, query=query), answers

    return render
