"""RULER's synthetic tasks as NVIDIA's generator defines them (arXiv 2404.06654; its ``scripts/data/synthetic`` at
main c3f5e3b, VT as changed by its commit 26ed7ba), written here from that definition.

Every prompt is ``[worked example] + instructions + haystack (what is asked hidden in it) + question``, wrapped in the
model's template, followed by the answer prefix the model continues. ``prompt tokens + the task's tokens_to_generate
<= length`` (RULER's budget: 128 NIAH, 30 VT, 120 CWE, 50 FWE), measured with the evaluated tokenizer. The haystack is
sized as RULER's generator sizes it (a size search per task and length, then each prompt stepped back by RULER's
step while too long: :func:`make_case`), or filled to the budget (``sizing="fill"``, :mod:`.fit`). Every draw comes
from ``random.Random(f"ruler:{seed}:{task}:{length}:{sample}")``: a prompt is reproducible from its seed alone.

* Retrieval (``niah_*``): needles ``One of the special magic numbers for {key} is: {value}.`` in a haystack of
  ``noise`` lines or of other ``needles`` (one a line, joined by newlines) or of the ``essay`` text (at sentence
  starts, at RULER's 40 depths); keys are adjective-noun pairs or UUIDs, values 7-digit numbers, word pairs or UUIDs.
  One key asked with one value: singular wording ("A special magic number is hidden ...", "... is").
* ``vt``: one chain of 4 hops ``VAR B = VAR A`` whose statements are lines of their own between noise lines, after a
  worked example (a chain with 3-letter names in a ~500-token prompt, with its answer; its names and value drawn per
  prompt).
* ``cwe``: the 10 most common words of a numbered list of English words (each common word 30 times, each other word 3;
  below 4K tokens 6 and 1), after a worked example (40 words, 10 common ones, with its answer; below 4K: 20).
* ``fwe``: a text of random 6-letter words with exact Zipf counts (``int(n * rank**-2 / zeta(2))``) over a vocabulary
  of (length - 50) / 50 words; the top-ranked word is "..." (the prompt says to ignore the dots); the answer is ranks
  2-4.

RULER's two QA tasks need SQuAD / HotpotQA, not available offline: left out (the average is over 11 of its 13 tasks).
``niah_single_words`` (word values) is an extra, outside the average. What still differs from NVIDIA's generator is
listed in docs/evals.md.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from easy_context.tasks.ruler.fit import largest_fitting
from easy_context.tasks.ruler.vocab import (
    KEYS,
    VALUES,
    coded_word,
    distinct,
    english_words,
    made_up_word,
    number,
    variable_name,
)

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
VT_PROMPT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER = (
    " Answer: According to the chain(s) of variable assignment in the text above, {count} variables are assigned the "
    "value {query}, they are: "
)
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
VT_EXAMPLE_TOKENS = 500  # the worked example is a VT prompt of this many tokens (with its budget), as RULER's
LONG = 4096  # from here on CWE uses its full frequencies and 40-word example (shorter prompts: 6 / 1 and 20 words)


@dataclass(frozen=True)
class RulerTask:
    """One task's definition (RULER's ``synthetic.yaml`` parameters)."""

    name: str
    kind: str  # "niah" | "vt" | "cwe" | "fwe"
    max_new_tokens: int  # RULER's tokens_to_generate: reserved in the prompt's budget, the generation budget
    haystack: str = "essay"  # niah: noise | essay | needles
    keys: str = "words"  # niah: words | uuids
    values: str = "numbers"  # niah: numbers | words | uuids
    num_keys: int = 1  # niah: needles of different keys (the first num_queries are asked)
    num_values: int = 1  # niah: values per key
    num_queries: int = 1
    chains: int = 1  # vt
    hops: int = 4
    top: int = 10  # cwe: how many common words are asked
    common_freq: int = 30  # cwe: occurrences of each common word ...
    rare_freq: int = 3  # ... and of each other one
    alpha: float = 2.0  # fwe: Zipf exponent
    in_average: bool = True  # one of RULER's tasks (the average and the effective length use those)

    @property
    def needs_essays(self) -> bool:
        return self.kind == "niah" and self.haystack == "essay"

    @property
    def needs_word_lists(self) -> bool:
        """English words (the wonderwords lists): word keys or values, or CWE's list."""
        return self.kind == "cwe" or (self.kind == "niah" and "words" in (self.keys, self.values))

    @property
    def singular(self) -> bool:
        """One value asked: RULER words the prompt in the singular."""
        return self.kind == "niah" and self.num_queries * self.num_values == 1


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
    RulerTask("fwe", "fwe", 50),
    RulerTask("niah_single_words", "niah", 128, values="words", in_average=False),
)}  # fmt: skip
DEFAULT_TASKS = tuple(name for name, task in TASKS.items() if task.in_average)
RULER_TASK_COUNT = 13  # RULER's tasks: the 11 above in the average and its 2 QA tasks


@dataclass
class RulerCase:
    """One prompt: the full model input ``text`` (ends with the answer prefix), what the output must contain."""

    task: str
    length: int  # the target: prompt tokens + max_new_tokens <= length
    sample: int
    text: str
    answers: list[str]
    max_new_tokens: int  # RULER's tokens_to_generate for the task
    units: int  # haystack units that fit (lines, essay words, list words, coded words)
    deviation: str = ""  # where a prompt too short for RULER's setting had to use a smaller one
    sizing: str = "ruler"  # how the haystack was sized (SIZINGS)


Count = Callable[[str], int]
Render = Callable[[int], tuple[str, str, list[str]]]  # units -> (prompt body, answer prefix, answers)
CweSetting = tuple[tuple[int, int], tuple[int, int, int] | None]  # (common, other) repeats; the example's (words, ..)


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


def _niah(task: RulerTask, rng: random.Random, essay_words: list[str]) -> Render:
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
    filler = _Lazy(random.Random(rng.random()), lambda r: NIAH_NEEDLE.format(
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


def _vt_statements(rng: random.Random, task: RulerTask, letters: int, value: str | None) -> list[list[str]]:
    """``task.chains`` chains of ``task.hops`` hops, each ``[VAR A = value, VAR B = VAR A , ...]`` (a hop statement
    ends in a space, as RULER writes it); the first chain's value is the one asked."""
    used: set[str] = set()
    chains = []
    for _ in range(task.chains):
        names = distinct(rng, lambda r: variable_name(r, letters), task.hops + 1, used)
        chain_value = value or number(rng, 5)
        chains.append([f"VAR {names[0]} = {chain_value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])])
    return chains


def _vt_context(chains: list[list[str]], n: int, layout_seed: float) -> str:
    """``n`` noise lines with every statement on a line of its own, as RULER lays them out: each chain in turn takes
    distinct line indexes drawn uniformly (sorted) among the lines so far, its j-th statement going before the line
    at its index (so two statements of one chain always have noise between them). Joined by newlines. The draw
    depends on ``layout_seed`` and ``n`` only."""
    rng = random.Random(f"{layout_seed}:{n}")
    lines = [NOISE] * n
    for chain in chains:
        at = sorted(rng.sample(range(max(len(lines), len(chain))), len(chain)))
        for j, (index, statement) in enumerate(zip(at, chain)):
            lines.insert(min(index + j, len(lines)), statement)
    return "\n".join(lines)


def _vt_render(chains: list[list[str]], layout_seed: float) -> Render:
    value = chains[0][0].split("= ")[1]
    names = [line.split()[1] for line in chains[0]]

    def render(n: int) -> tuple[str, str, list[str]]:
        body = VT_PROMPT.format(context=_vt_context(chains, n, layout_seed), query=value)
        return body, VT_ANSWER.format(count=len(names), query=value), names

    return render


def _vt_example(task: RulerTask, rng: random.Random, count: Count, length: int, layout: random.Random) -> str:
    """RULER's worked VT example: a VT prompt with 3-letter names (at most 10 hops) whose prompt, answer prefix
    included, is at most 500 tokens (scaled down below 4K tokens), then a space, its answer and a newline. Its size
    and statement lines come from ``layout`` (one draw per task and length, as RULER makes one example per run); its
    names and value from ``rng`` (per prompt, as RULER's ``randomize_icl`` redraws them)."""
    shape = RulerTask("vt_example", "vt", task.max_new_tokens, chains=task.chains, hops=min(task.hops, 10))
    layout_seed = layout.random()
    sized = _vt_render(_vt_statements(layout, shape, 3, "12345"), layout_seed)
    budget = VT_EXAMPLE_TOKENS * min(length, LONG) // LONG
    try:
        n = largest_fitting(lambda n: count("".join(sized(n)[:2])), budget)
    except ValueError:  # a prompt far below RULER's lengths: the example without noise
        n = 0
    body, prefix, answers = _vt_render(_vt_statements(rng, shape, 3, None), layout_seed)(n)
    return body + prefix + " " + " ".join(answers) + "\n"


def _vt(task: RulerTask, rng: random.Random, count: Count, length: int, layout: random.Random) -> Render:
    example = _vt_example(task, random.Random(rng.random()), count, length, layout)
    chain = _vt_render(_vt_statements(rng, task, 5, None), rng.random())

    def render(n: int) -> tuple[str, str, list[str]]:
        body, prefix, answers = chain(n)
        return example + "\n" + body, prefix, answers

    return render


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _cwe(task: RulerTask, rng: random.Random, freq: tuple[int, int], example: tuple[int, int, int] | None) -> Render:
    """The numbered list of ``task.top`` common words (``freq[0]`` times each) and ``n`` others (``freq[1]`` times
    each), after a worked example of ``example[0]`` words (the common ones ``example[1]`` times, the others
    ``example[2]``) with its answer; None: no example (only for prompts far below RULER's lengths)."""
    english = list(english_words())
    pool = rng.sample(english, len(english))  # this prompt's words in the order they are taken
    more = _Lazy(random.Random(rng.random()), made_up_word, set(english))  # past the English lists' ~8K words
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


def _fwe(task: RulerTask, rng: random.Random, length: int) -> Render:
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


SIZINGS = ("ruler", "fill")


def ruler_step(task: RulerTask, length: int) -> int:
    """RULER's back-off step (haystack units) when a prompt drawn at the searched size is too long: 500 essay words,
    25 noise / needle lines (5 below 4K tokens), 10 VT noise lines (5 below 4K), 10 CWE words; FWE's word grid of
    1/32 of the prompt budget."""
    if task.kind == "niah":
        return 500 if task.haystack == "essay" else (25 if length >= LONG else 5)
    if task.kind == "vt":
        return 10 if length >= LONG else 5
    if task.kind == "cwe":
        return 10
    return max((length - task.max_new_tokens) // 32, 1)


def ruler_offset(task: RulerTask) -> int:
    """RULER's size unit minus ours: CWE's search counts every distinct word of the list (the common ones too), ours
    the other words; every other task counts the same units."""
    return task.top if task.kind == "cwe" else 0


class RulerPrompts:
    """The prompts of one task, length and (CWE) frequency setting, by draw: ``tokens(n, draw)`` is the token count of
    the whole model input with ``n`` haystack units drawn from ``random.Random(f"ruler:{seed}:{task}:{length}:{draw}")``
    (a sample's draw is its index; the size search's probes of ``n`` units are drawn as ``"search:n"``, FWE's search
    as ``"search"``). ``estimate_tokens(n)``: the prompt RULER estimates the tokens per unit from (draw
    ``"search:estimate"``; VT's without its worked example)."""

    def __init__(
        self,
        task: RulerTask,
        length: int,
        count_tokens: Count,
        wrap: Callable[[str, str], str],
        essay_words: list[str] | None = None,
        seed: int = 0,
        setting: CweSetting = ((0, 0), None),
    ):
        self.task, self.length, self.count_tokens, self.wrap = task, length, count_tokens, wrap
        self.essay_words, self.seed, self.setting = essay_words or [], seed, setting
        self._drawn: dict[object, Render] = {}

    def rng(self, draw: object) -> random.Random:
        return random.Random(f"ruler:{self.seed}:{self.task.name}:{self.length}:{draw}")

    def render(self, draw: object) -> Render:
        """``n -> (prompt body, answer prefix, answers)`` of one draw (built once)."""
        if draw not in self._drawn:
            task, rng = self.task, self.rng(draw)
            if task.kind == "cwe":
                render = _cwe(task, rng, *self.setting)
            elif task.kind == "vt":  # one worked-example layout for every draw of a task and length
                render = _vt(task, rng, self.count_tokens, self.length, self.rng("vt-example"))
            elif task.kind == "niah":
                render = _niah(task, rng, self.essay_words)
            else:
                render = _fwe(task, rng, self.length)
            self._drawn[draw] = render
        return self._drawn[draw]

    def counter(self, draw: object) -> Callable[[int], int]:
        """``n -> tokens`` of one draw."""
        render = self.render(draw)

        def count(n: int) -> int:
            body, prefix, _ = render(n)
            return self.count_tokens(self.wrap(body, prefix))

        return count

    def tokens(self, n: int, draw: object) -> int:
        return self.counter(draw)(n)

    def estimate_tokens(self, n: int) -> int:
        body, prefix, _ = self.render("search:estimate")(n)
        if self.task.kind == "vt":  # RULER estimates from the task's prompt alone: its worked example left out
            body = body[body.rindex(VT_PROMPT[:60]) :]
        return self.count_tokens(self.wrap(body, prefix))


def _ruler_search(prompts: RulerPrompts, target: int) -> int:
    """The size RULER's search settles on (our units). NIAH, VT, CWE: a bisection in which every probe is a new draw,
    between one step and 3x (CWE: 2x) the size that the tokens per unit of one probe (``step`` units; CWE: 4096
    words) predict for the whole length (generation included, as RULER's estimate): the largest probe that fit (so a
    draw that came out short is often the one kept, and a new prompt at that size is too long about half the time).
    CWE's bisection runs over all distinct words, as RULER's. FWE: one draw on a grid ``budget // 6 + k * step``
    grown until a prompt reaches the budget, then one step back."""
    task, length = prompts.task, prompts.length
    step, offset = ruler_step(task, length), ruler_offset(task)
    if task.kind == "fwe":
        n = target // 6
        while prompts.tokens(n, "search") < target:
            n += step
        return n - step
    if task.kind == "cwe":
        per_unit = prompts.estimate_tokens(4096 - offset) / 4096
        upper = int(length // per_unit) * 2
    else:
        per_unit = prompts.estimate_tokens(step) / step
        upper = int(length / per_unit * 3)
    lo, hi, best = step, max(upper, 2 * step), None
    while lo <= hi:
        mid = (lo + hi) // 2
        if prompts.tokens(mid - offset, f"search:{mid - offset}") <= target:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return (step if best is None else best) - offset


def _ruler_units(task: RulerTask, length: int, target: int, count: Callable[[int], int], search: int) -> int:
    """RULER's size for one prompt: the searched size (on another draw), stepped back by :func:`ruler_step` while this
    prompt is too long; the largest fitting size where the steps run out."""
    step, n = ruler_step(task, length), search
    while n + ruler_offset(task) > step and count(n) > target:
        n -= step
    return n if n >= 0 and count(n) <= target else largest_fitting(count, target)


_SEARCHED: dict[tuple, int] = {}  # (task, length, seed, setting, tokenizer, template, essay) -> searched size


def make_case(
    task: RulerTask,
    length: int,
    sample: int,
    count_tokens: Count,
    wrap: Callable[[str, str], str],
    essay_words: list[str] | None = None,
    seed: int = 0,
    sizing: str = "ruler",
) -> RulerCase:
    """The prompt of ``task`` at ``length`` tokens for ``sample``, with ``count_tokens(prompt) + task.max_new_tokens
    <= length``.

    ``sizing="ruler"`` (default) sizes the haystack as RULER's generator does: one size search per task and length on
    draws of its own, then each prompt at that size, stepped back by :func:`ruler_step` units while it is too long
    (prompt + generation come to ~0.75-1.0 of the length, as RULER's, by the luck of the search's draws).
    ``sizing="fill"``: each prompt's largest haystack that fits (~1.0 of the length).

    ``wrap(body, answer_prefix)`` is the full model input (base: ``body + answer_prefix``; or the chat template's);
    ``count_tokens(text)`` its token count as the model sees it (BOS included). ``essay_words``: the essay haystack,
    needed by the ``essay`` tasks (a ValueError without it)."""
    if sizing not in SIZINGS:
        raise ValueError(f"unknown sizing {sizing!r}: choose one of {', '.join(SIZINGS)}")
    if task.needs_essays and not essay_words:
        raise ValueError(f"{task.name} hides its needles in essays: pass --haystack_dir DIR of .txt files")
    target = length - task.max_new_tokens
    if target <= 0:
        raise ValueError(f"{length} tokens leave no room beside {task.max_new_tokens} to generate: ask for a longer "
                         "length")  # fmt: skip

    if task.kind == "cwe":  # RULER's frequencies; a prompt too short for them gets lower ones (recorded)
        short: list[CweSetting] = [((f, 1), (20, 3, 1)) for f in range(6, 1, -1)]
        short += [((f, 1), None) for f in range(6, 1, -1)]  # far below RULER's lengths: no room for the example
        settings = [((task.common_freq, task.rare_freq), (40, 10, 3))] + short if length >= LONG else short
    else:
        settings = [((0, 0), None)]

    deviation, error = "", None
    for i, setting in enumerate(settings):
        prompts = RulerPrompts(task, length, count_tokens, wrap, essay_words, seed, setting)
        count = prompts.counter(sample)
        try:
            if sizing == "fill":
                units = largest_fitting(count, target)
            else:
                essay = (len(essay_words), tuple(essay_words[:64])) if essay_words else None
                key = (task.name, length, seed, i, count_tokens, wrap, essay)
                if key not in _SEARCHED:
                    if len(_SEARCHED) >= 1024:  # callers that pass new functions each time: do not grow forever
                        _SEARCHED.clear()
                    _SEARCHED[key] = _ruler_search(prompts, target)
                units = _ruler_units(task, length, target, count, _SEARCHED[key])
        except ValueError as exc:
            error = exc
            continue
        if i:
            freq, example = setting
            ruler = settings[0][0]
            deviation = (f"common words x{freq[0]}, others x{freq[1]}{'' if example else ', no worked example'} "
                         f"(RULER's x{ruler[0]} / x{ruler[1]} do not fit {length} tokens)")  # fmt: skip
        body, prefix, answers = prompts.render(sample)(units)
        return RulerCase(task.name, length, sample, wrap(body, prefix), answers, task.max_new_tokens, units, deviation,
                         sizing)  # fmt: skip
    raise ValueError(f"{error} (with {task.max_new_tokens} tokens to generate)")


def unit_name(task: RulerTask) -> str:
    """What one haystack unit of ``task`` is (the audit file's ``units``)."""
    if task.kind == "niah":
        return {"essay": "essay words", "noise": "noise lines", "needles": "needle lines"}[task.haystack]
    return {"vt": "noise lines", "cwe": "other words", "fwe": "coded words"}[task.kind]
