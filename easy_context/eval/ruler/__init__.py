"""RULER's synthetic long-context tasks (Hsieh et al., arXiv 2404.06654), generated locally, scored by generation.

The prompts come from :mod:`easy_context.tasks.ruler` (shared with data preparation):

* ``tasks.ruler.vocab`` — English words (wonderwords' lists), keys, values (numbers, word pairs, UUIDs), FWE's coded
  words and variable names, from a seeded RNG.
* ``tasks.ruler.tasks`` — the task definitions; ``tasks.ruler.retrieval``, ``.tracing``, ``.aggregation`` — the
  prompts of each task family.
* ``tasks.ruler.sizing`` — RULER's size search and step-back; ``tasks.ruler.fit`` — the largest haystack whose prompt
  stays within the budget (``--sizing fill``).
* ``tasks.ruler.builders`` — one prompt per (task, length, sample), built as NVIDIA's generator builds it to RULER's
  token budget.

Here:

* :mod:`.scoring` — RULER's metric (share of expected strings in the output), 95 % intervals, the effective length.

The program is :mod:`easy_context.eval.run_ruler` (``eval_ruler.py``, ``easy-context-eval-ruler``).
"""

from easy_context.eval.ruler.scoring import effective_length, string_match_all
from easy_context.tasks.ruler.builders import DEFAULT_TASKS, TASKS, RulerCase, RulerTask, make_case

__all__ = ["DEFAULT_TASKS", "TASKS", "RulerCase", "RulerTask", "effective_length", "make_case", "string_match_all"]
