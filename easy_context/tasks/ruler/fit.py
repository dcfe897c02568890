"""The size search: the largest haystack (in units: sentences, words, list items) whose prompt fits a token target.

``count(n)`` is the token count of the whole model input built with ``n`` units (it grows with ``n``, not
necessarily by the same amount per unit). The search takes Newton steps on the measured tokens per unit from a small
probe and ends with a bisection of what bracket is left, so a 128K-token prompt is encoded a handful of times.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def largest_fitting(count: Callable[[int], int], target: int, first: int = 16, limit: int = 10_000_000) -> int:
    """The largest ``n`` in ``[0, limit]`` with ``count(n) <= target``; ``ValueError`` when even ``n = 0`` is too long.

    ``count`` must be non-decreasing in ``n``; ``first`` is the probe size of the linear estimate."""
    cache: dict[int, int] = {}

    def c(n: int) -> int:
        if n not in cache:
            cache[n] = count(n)
        return cache[n]

    base = c(0)
    if base > target:
        raise ValueError(
            f"the task's instructions alone take {base} tokens, more than the target length {target}: ask for a "
            "longer length"
        )
    lo, hi = 0, None  # c(lo) <= target < c(hi)
    n = min(first, limit)
    for _ in range(12):  # Newton steps on the measured tokens per unit, each one shrinking the bracket
        n = max(n, lo + 1) if hi is None else min(max(n, lo + 1), hi - 1)
        if n > limit or (hi is not None and hi - lo <= 1):
            break
        tokens = c(n)
        slope = max((tokens - base) / n, 1e-6)
        if tokens <= target:
            lo = n
            n += max(int((target - tokens) / slope), 1)
        else:
            hi = n
            n -= max(math.ceil((tokens - target) / slope), 1)
    if hi is None:  # nothing too long found yet: double until something is
        n = max(lo, 1)
        while hi is None:
            n = min(n * 2, limit)
            if c(n) <= target:
                lo = n
                if n == limit:
                    return limit
            else:
                hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if c(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo
