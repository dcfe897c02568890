"""RULER's synthetic tasks as NVIDIA defines them: the task definitions (:mod:`.tasks`), word and key vocabularies
(:mod:`.vocab`), one module per task family (:mod:`.retrieval`: NIAH; :mod:`.tracing`: VT; :mod:`.aggregation`: CWE
and FWE), RULER's sizing of a haystack (:mod:`.sizing`) and the search that fills a token budget (:mod:`.fit`), and
one prompt per task, length and sample (:mod:`.builders`); scoring lives with the evaluation
(:mod:`easy_context.eval.ruler`)."""
