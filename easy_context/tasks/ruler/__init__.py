"""RULER's synthetic tasks as NVIDIA defines them: word and key vocabularies (:mod:`.vocab`), the size search that
fills a token budget (:mod:`.fit`) and the task builders (:mod:`.builders`); scoring lives with the evaluation
(:mod:`easy_context.eval.ruler`)."""
