"""RULER's synthetic tasks, defined as in the paper (arXiv 2404.06654, Table 1 and Appendix B), generated locally.

Every prompt is ``instructions + haystack (with what is asked hidden in it) + question`` followed by an answer
prefix the model continues (after the chat template's generation prompt with ``chat``). It is built to a target
token count with the evaluated tokenizer: the largest haystack that fits (:mod:`.fit`), so a prompt is within one
haystack unit (a noise sentence, an essay word, a needle, a list item) of the target. Every draw comes from
``random.Random(f"ruler:{seed}:{task}:{length}:{sample}")``: a prompt is reproducible from its seed alone.

Retrieval (needle in a haystack), haystack ``noise`` (the repeated "The grass is green..." lines), ``essay`` (the
essays' words) or ``needles`` (other key-value needles), keys ``word-word`` or UUIDs, values numbers, words or UUIDs:
``niah_single_1/2/3``, ``niah_multikey_1/2/3`` (one of several keys asked), ``niah_multivalue`` (every value of a
key), ``niah_multiquery`` (several keys asked at once). Multi-hop tracing: ``vt`` (variables bound through a
chain of ``VAR X = VAR Y`` assignments). Aggregation: ``cwe`` (the 10 most common words of a numbered list) and
``fwe`` (the 3 most frequent words of a Zipf-distributed text). RULER's two QA tasks need SQuAD / HotpotQA, which
are not available offline: left out. ``niah_single_words`` (word values) is an extra, outside the average.

Differences from RULER's generator (its code is not used): words are made up (:mod:`.vocab`; RULER uses English
words) and the aggregation prompts carry no worked example.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from .fit import largest_fitting
from .vocab import KEYS, VALUES, distinct, made_up_word, number, variable_name

NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")

NIAH_NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_PROMPT = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for {query} mentioned in the provided "
    "text?"
)
NIAH_ANSWER = " The special magic {kind} for {query} mentioned in the provided text are"
VT_PROMPT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER = (
    " Answer: According to the chain(s) of variable assignment in the text above, {count} variables are assigned the "
    "value {query}, they are:"
)
CWE_PROMPT = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the {count} most common words in the above list?"
)
CWE_ANSWER = " Answer: The top {count} words that appear most often in the list are:"
FWE_PROMPT = (
    "Read the following coded text and track the frequency of each coded word. Find the {count} most frequently "
    "appeared coded words.\n{context}\nQuestion: Do not provide any explanation. What are the {count} most "
    "frequently appeared words in the above coded text?"
)
FWE_ANSWER = " Answer: According to the coded text above, the {count} most frequently appeared words are:"


@dataclass(frozen=True)
class RulerTask:
    """One task's definition (RULER's ``synthetic.yaml`` parameters)."""

    name: str
    kind: str  # "niah" | "vt" | "cwe" | "fwe"
    max_new_tokens: int  # RULER's generation budget for the task
    haystack: str = "essay"  # niah: noise | essay | needles
    keys: str = "words"  # niah: words | uuids
    values: str = "numbers"  # niah: numbers | words | uuids
    num_keys: int = 1  # niah: needles of different keys (the first num_queries are asked)
    num_values: int = 1  # niah: values per key
    num_queries: int = 1
    chains: int = 1  # vt
    hops: int = 4
    top: int = 10  # cwe / fwe: how many words are asked
    common_freq: int = 30  # cwe: occurrences of each common word ...
    rare_freq: int = 3  # ... and of each rare one
    alpha: float = 2.0  # fwe: Zipf exponent
    in_average: bool = True  # one of RULER's tasks (the average and the effective length use those)

    @property
    def needs_essays(self) -> bool:
        return self.kind == "niah" and self.haystack == "essay"


TASKS: dict[str, RulerTask] = {t.name: t for t in (
    RulerTask("niah_single_1", "niah", 128, haystack="noise"),
    RulerTask("niah_single_2", "niah", 128),
    RulerTask("niah_single_3", "niah", 128, values="uuids"),
    RulerTask("niah_multikey_1", "niah", 128, num_keys=4),
    RulerTask("niah_multikey_2", "niah", 128, haystack="needles"),
    RulerTask("niah_multikey_3", "niah", 128, haystack="needles", keys="uuids", values="uuids"),
    RulerTask("niah_multivalue", "niah", 128, num_values=4),
    RulerTask("niah_multiquery", "niah", 128, num_keys=4, num_queries=4),
    RulerTask("vt", "vt", 30),
    RulerTask("cwe", "cwe", 120),
    RulerTask("fwe", "fwe", 50, top=3),
    RulerTask("niah_single_words", "niah", 128, values="words", in_average=False),
)}  # fmt: skip
DEFAULT_TASKS = tuple(name for name, task in TASKS.items() if task.in_average)


@dataclass
class RulerCase:
    """One prompt: the full model input ``text`` (ends with the answer prefix), what the output must contain."""

    task: str
    length: int  # the target token count
    sample: int
    text: str
    answers: list[str]
    max_new_tokens: int
    units: int  # haystack units that fit


Render = Callable[[int], tuple[str, str, list[str]]]  # units -> (prompt body, answer prefix, answers)


def _join_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


class _Lazy:
    """``make(rng)`` values drawn on demand from one RNG: ``lazy[:n]`` is the same prefix for every ``n``."""

    def __init__(self, rng: random.Random, make, avoid: set[str] | None = None):
        self.rng, self.make, self.avoid, self.items = rng, make, avoid if avoid is not None else set(), []

    def __getitem__(self, part: slice) -> list[str]:
        while len(self.items) < part.stop:
            self.items += distinct(self.rng, self.make, max(part.stop - len(self.items), 64), self.avoid)
        return self.items[part]


def _sentence_start(units: list[str], at: int, reach: int = 64) -> int:
    """The nearest index ``<= at`` (within ``reach``) where a sentence starts, else ``at``."""
    for j in range(at, max(at - reach, 0) - 1, -1):
        if j == 0 or units[j - 1].endswith((".", "?", "!")):
            return j
    return at


def _insert(units: list[str], inserts: list[tuple[float, str]], snap: bool) -> str:
    """``units`` joined by spaces with each ``(depth, text)`` placed at that fraction of them (``snap``: moved back
    to a sentence start, so a needle never splits an essay sentence)."""
    places: dict[int, list[str]] = {}
    for depth, text in inserts:
        at = round(depth * len(units))
        places.setdefault(_sentence_start(units, at) if snap else at, []).append(text)
    out: list[str] = []
    for j in range(len(units) + 1):
        out += places.get(j, [])
        if j < len(units):
            out.append(units[j])
    return " ".join(out)


def _niah(task: RulerTask, rng: random.Random, essay_words: list[str]) -> Render:
    used: set[str] = set()
    keys = distinct(rng, KEYS[task.keys], task.num_keys, used)
    values = {key: distinct(rng, VALUES[task.values], task.num_values, used) for key in keys}
    needles = [NIAH_NEEDLE.format(kind=task.values, key=key, value=v) for key in keys for v in values[key]]
    rng.shuffle(needles)
    depths = [rng.random() for _ in needles]
    asked = keys[: task.num_queries]
    answers = [v for key in asked for v in values[key]]
    query = _join_list(asked)
    filler = _Lazy(random.Random(rng.random()), lambda r: NIAH_NEEDLE.format(
        kind=task.values, key=KEYS[task.keys](r), value=VALUES[task.values](r)), used)  # fmt: skip

    def render(n: int) -> tuple[str, str, list[str]]:
        if task.haystack == "noise":
            units = [NOISE[i % len(NOISE)] for i in range(n)]
        elif task.haystack == "essay":
            units = [essay_words[i % len(essay_words)] for i in range(n)]
        else:
            units = filler[:n]
        context = _insert(units, list(zip(depths, needles)), snap=task.haystack == "essay")
        body = NIAH_PROMPT.format(kind=task.values, context=context, query=query)
        return body, NIAH_ANSWER.format(kind=task.values, query=query), answers

    return render


def _vt(task: RulerTask, rng: random.Random) -> Render:
    used: set[str] = set()
    chains, statements = [], []
    for _ in range(task.chains):
        names = distinct(rng, variable_name, task.hops + 1, used)
        value = number(rng, 5)
        chains.append((value, names))
        lines = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        depths = sorted(rng.random() for _ in lines)  # in order: each assignment after the one it reads
        statements += zip(depths, lines)
    value, names = chains[0]

    def render(n: int) -> tuple[str, str, list[str]]:
        context = _insert([NOISE[i % len(NOISE)] for i in range(n)], statements, snap=False)
        body = VT_PROMPT.format(context=context, query=value)
        return body, VT_ANSWER.format(count=len(names), query=value), list(names)

    return render


def _cwe(task: RulerTask, rng: random.Random) -> Render:
    used: set[str] = set()
    common = distinct(rng, made_up_word, task.top, used)
    rare = _Lazy(random.Random(rng.random()), made_up_word, used)
    order_seed = rng.random()

    def render(n: int) -> tuple[str, str, list[str]]:
        words = common * task.common_freq + rare[:n] * task.rare_freq
        random.Random(f"{order_seed}:{n}").shuffle(words)
        context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        return CWE_PROMPT.format(context=context, count=task.top), CWE_ANSWER.format(count=task.top), list(common)

    return render


def _fwe(task: RulerTask, rng: random.Random) -> Render:
    vocab = distinct(rng, made_up_word, 2000)
    weights = [1.0 / (rank + 1) ** task.alpha for rank in range(len(vocab))]
    cumulative = [sum(weights[: i + 1]) for i in range(len(weights))]
    stream_seed = rng.random()

    def render(n: int) -> tuple[str, str, list[str]]:
        words = random.Random(stream_seed).choices(vocab, cum_weights=cumulative, k=n)  # prefix-stable in n
        counts = Counter(words)
        top = sorted(counts, key=lambda w: (-counts[w], vocab.index(w)))[: task.top]
        body = FWE_PROMPT.format(context=" ".join(words), count=task.top)
        return body, FWE_ANSWER.format(count=task.top), top

    return render


def make_case(
    task: RulerTask,
    length: int,
    sample: int,
    count_tokens: Callable[[str], int],
    wrap: Callable[[str, str], str],
    essay_words: list[str] | None = None,
    seed: int = 0,
) -> RulerCase:
    """The prompt of ``task`` at ``length`` tokens for ``sample``.

    ``wrap(body, answer_prefix)`` is the full model input (plain: ``body + answer_prefix``; or the chat template's);
    ``count_tokens(text)`` its token count as the model sees it (BOS included). ``essay_words``: the essay haystack,
    needed by the ``essay`` tasks (a ValueError without it)."""
    rng = random.Random(f"ruler:{seed}:{task.name}:{length}:{sample}")
    if task.needs_essays and not essay_words:
        raise ValueError(f"{task.name} hides its needles in essays: pass --haystack_dir DIR of .txt files")
    render = {"niah": lambda: _niah(task, rng, essay_words or []), "vt": lambda: _vt(task, rng),
              "cwe": lambda: _cwe(task, rng), "fwe": lambda: _fwe(task, rng)}[task.kind]()  # fmt: skip

    def count(n: int) -> int:
        body, prefix, _ = render(n)
        return count_tokens(wrap(body, prefix))

    if task.kind == "cwe":  # short prompts: fewer repeats of the common words, so the list fits
        for freq in range(task.common_freq, task.rare_freq, -1):
            trial = replace(task, common_freq=freq)
            render = _cwe(trial, random.Random(f"ruler:{seed}:{task.name}:{length}:{sample}"))
            if count(0) <= length // 2:
                break
    units = largest_fitting(count, length)
    body, prefix, answers = render(units)
    return RulerCase(task.name, length, sample, wrap(body, prefix), answers, task.max_new_tokens, units)
