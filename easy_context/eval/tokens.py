"""Token helpers of the evaluations (a model input's own ids: :func:`easy_context.models.tokenizer.encode`)."""

from __future__ import annotations

import sys


def unlimited(tokenizer):
    """Silence "sequence longer than the model maximum" warnings: long inputs are the point of these evals."""
    tokenizer.model_max_length = sys.maxsize
    return tokenizer


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
