"""RULER's sizing: how many haystack units a prompt gets. One size search per task and length on draws of its own,
then each prompt at that size stepped back by RULER's step while too long (:func:`ruler_units`); every draw of a
prompt family comes from :class:`RulerPrompts`."""

from __future__ import annotations

import random
from collections.abc import Callable

from easy_context.tasks.ruler.aggregation import CweSetting, cwe, fwe
from easy_context.tasks.ruler.fit import largest_fitting
from easy_context.tasks.ruler.retrieval import niah
from easy_context.tasks.ruler.tasks import LONG, Count, Render, RulerTask
from easy_context.tasks.ruler.tracing import VT_PROMPT, vt

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
                render = cwe(task, rng, *self.setting)
            elif task.kind == "vt":  # one worked-example layout for every draw of a task and length
                render = vt(task, rng, self.count_tokens, self.length, self.rng("vt-example"))
            elif task.kind == "niah":
                render = niah(task, rng, self.essay_words)
            else:
                render = fwe(task, rng, self.length)
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


def ruler_search(prompts: RulerPrompts, target: int) -> int:
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


def ruler_units(task: RulerTask, length: int, target: int, count: Callable[[int], int], search: int) -> int:
    """RULER's size for one prompt: the searched size (on another draw), stepped back by :func:`ruler_step` while this
    prompt is too long; the largest fitting size where the steps run out."""
    step, n = ruler_step(task, length), search
    while n + ruler_offset(task) > step and count(n) > target:
        n -= step
    return n if n >= 0 and count(n) <= target else largest_fitting(count, target)
