"""Aggregation: ``cwe`` (the most common words of a numbered list of English words, after a worked example) and
``fwe`` (the most frequent coded words of a text with exact Zipf counts)."""

from __future__ import annotations

import functools
import random

from easy_context.tasks.ruler.tasks import Render, RulerTask
from easy_context.tasks.ruler.vocab import LazyDistinct, coded_word, distinct, english_words, made_up_word

CWE_PROMPT = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the {count} most common words in the above list?"
)
CWE_ANSWER = " Answer: The top {count} words that appear most often in the list are:"
FWE_PROMPT = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER = " Answer: According to the coded text above, the three most frequently appeared words are:"
FWE_DOTS = "..."  # the top-ranked word: noise the prompt says to ignore
CweSetting = tuple[tuple[int, int], tuple[int, int, int] | None]  # (common, other) repeats; the example's (words, ..)


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe(task: RulerTask, rng: random.Random, freq: tuple[int, int], example: tuple[int, int, int] | None) -> Render:
    """The numbered list of ``task.top`` common words (``freq[0]`` times each) and ``n`` others (``freq[1]`` times
    each), after a worked example of ``example[0]`` words (the common ones ``example[1]`` times, the others
    ``example[2]``) with its answer; None: no example (only for prompts far below RULER's lengths)."""
    english = list(english_words())
    pool = rng.sample(english, len(english))  # this prompt's words in the order they are taken
    more = LazyDistinct(random.Random(rng.random()), made_up_word, set(english))  # past the English lists' ~8K words
    order_seed = rng.random()
    worked = ""
    if example:
        sample = rng.sample(english, example[0])  # drawn apart from the prompt's words, as RULER's (may overlap)
        ex_common, ex_rare = sample[: task.top], sample[task.top :]
        ex_items = ex_common * example[1] + ex_rare * example[2]
        random.Random(rng.random()).shuffle(ex_items)
        shown = CWE_PROMPT.format(context=_numbered(ex_items), count=task.top) + CWE_ANSWER.format(count=task.top)
        worked = shown + " " + _numbered(ex_common) + "\n"
    common = pool[: task.top]

    def render(n: int) -> tuple[str, str, list[str]]:
        rare = pool[task.top : task.top + n]
        if len(rare) < n:
            rare += more[: n - len(rare)]
        items = common * freq[0] + rare * freq[1]
        random.Random(f"{order_seed}:{n}").shuffle(items)
        body = worked + CWE_PROMPT.format(context=_numbered(items), count=task.top)
        return body, CWE_ANSWER.format(count=task.top), list(common)

    return render


@functools.cache
def zeta(alpha: float) -> float:
    """Riemann's zeta(alpha), alpha > 1: a partial sum plus the Euler-Maclaurin tail (~1e-12 for alpha = 2)."""
    terms = 10_000
    return sum(k**-alpha for k in range(1, terms)) + terms ** (1 - alpha) / (alpha - 1) + terms**-alpha / 2


def zipf_counts(words: int, vocabulary: int, alpha: float) -> list[int]:
    """FWE's exact counts: rank ``k`` (from 1) occurs ``int(words * k**-alpha / zeta(alpha))`` times."""
    return [int(words * k**-alpha / zeta(alpha)) for k in range(1, vocabulary + 1)]


def fwe(task: RulerTask, rng: random.Random, length: int) -> Render:
    vocab = distinct(rng, coded_word, max((length - task.max_new_tokens) // 50, 5))  # RULER: 1/50 of the prompt budget
    vocab[0] = FWE_DOTS
    stream_seed = rng.random()
    zeta_cache: dict[int, list[int]] = {}

    def render(n: int) -> tuple[str, str, list[str]]:
        counts = zeta_cache.setdefault(n, zipf_counts(n, len(vocab), task.alpha))
        words = [w for w, c in zip(vocab, counts) for _ in range(c)]
        random.Random(f"{stream_seed}:{n}").shuffle(words)
        return FWE_PROMPT.format(context=" ".join(words)), FWE_ANSWER, vocab[1:4]

    return render
