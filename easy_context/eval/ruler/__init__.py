"""RULER's synthetic long-context tasks (Hsieh et al., arXiv 2404.06654), generated locally, scored by generation.

* :mod:`.vocab` — made-up words, keys, values (numbers, words, UUIDs) and variable names, from a seeded RNG.
* :mod:`.tasks` — the task definitions (retrieval, multi-hop tracing, aggregation) and one prompt per
  (task, length, sample), built to a target token count.
* :mod:`.fit` — the prompt's size search (the largest haystack whose prompt stays within the target).
* :mod:`.scoring` — RULER's metric (share of expected strings in the output) and the effective length.

The program is :mod:`easy_context.eval.run_ruler` (``eval_ruler.py``, ``easy-context-eval-ruler``).
"""

from .scoring import effective_length, string_match_all
from .tasks import DEFAULT_TASKS, TASKS, RulerCase, RulerTask, make_case

__all__ = ["DEFAULT_TASKS", "TASKS", "RulerCase", "RulerTask", "effective_length", "make_case", "string_match_all"]
