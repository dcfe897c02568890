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

from collections.abc import Callable

from easy_context.tasks.ruler.aggregation import FWE_DOTS, CweSetting, zeta, zipf_counts
from easy_context.tasks.ruler.fit import largest_fitting
from easy_context.tasks.ruler.retrieval import DEPTHS, NOISE
from easy_context.tasks.ruler.sizing import SIZINGS, RulerPrompts, ruler_offset, ruler_search, ruler_step, ruler_units
from easy_context.tasks.ruler.tasks import (
    DEFAULT_TASKS,
    LONG,
    RULER_TASK_COUNT,
    TASKS,
    Count,
    RulerCase,
    RulerTask,
    unit_name,
)

__all__ = [
    "DEFAULT_TASKS",
    "DEPTHS",
    "FWE_DOTS",
    "NOISE",
    "RULER_TASK_COUNT",
    "SIZINGS",
    "TASKS",
    "RulerCase",
    "RulerPrompts",
    "RulerTask",
    "make_case",
    "ruler_offset",
    "ruler_step",
    "unit_name",
    "zeta",
    "zipf_counts",
]

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
                    _SEARCHED[key] = ruler_search(prompts, target)
                units = ruler_units(task, length, target, count, _SEARCHED[key])
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
