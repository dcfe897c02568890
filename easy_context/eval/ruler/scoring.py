"""RULER's scores: the share of the expected strings found in the output, averages with 95 % intervals, and the
effective length."""

from __future__ import annotations

import math
from collections import defaultdict

RULER_THRESHOLD = 0.856  # Llama-2-7B's RULER average at 4K: RULER's bar for "effective"
RULER_THRESHOLD_SOURCE = "RULER's: Llama-2-7B's average at 4K (85.6 %)"
Z95 = 1.959964


def string_match_all(output: str, answers: list[str]) -> float:
    """RULER's ``string_match_all``: the fraction of ``answers`` that occur in ``output`` (case-insensitive).

    It can only grow as the output grows, so generation may stop once every answer is in it (same score)."""
    text = output.lower()
    return sum(answer.lower() in text for answer in answers) / len(answers)


def all_found(output: str, answers: list[str]) -> bool:
    return string_match_all(output, answers) == 1.0


def _cells(rows: list[dict], key: str) -> dict[tuple[str, int], list[float]]:
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in rows:
        cells[(row["task"], int(row["length"]))].append(float(row[key]))
    return dict(sorted(cells.items()))


def table(rows: list[dict], key: str = "score") -> dict[str, dict[int, float]]:
    """Mean ``key`` per task and length: ``{task: {length: mean}}``."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (task, length), values in _cells(rows, key).items():
        out[task][length] = sum(values) / len(values)
    return dict(out)


def counts(rows: list[dict]) -> dict[str, dict[int, int]]:
    """Prompts per task and length: ``{task: {length: n}}``."""
    out: dict[str, dict[int, int]] = defaultdict(dict)
    for (task, length), values in _cells(rows, "score").items():
        out[task][length] = len(values)
    return dict(out)


def wilson(mean: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a mean of ``n`` scores in [0, 1].

    Exact coverage for 0/1 scores; for partial scores (a share of several answers) it is conservative, since a
    score in [0, 1] with mean p has variance at most p (1 - p)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def samples_for(half_width: float, z: float = Z95) -> int:
    """The fewest prompts per cell whose Wilson interval is at most ``+-half_width`` at any mean (the widest: 0.5)."""
    n = 1
    while True:
        low, high = wilson(0.5, n, z)
        if (high - low) / 2 <= half_width:
            return n
        n += 1


def averages(scores: dict[str, dict[int, float]], tasks: list[str]) -> dict[int, float]:
    """The mean over ``tasks`` at each length (RULER's "Avg." column); lengths every one of them was scored at."""
    lengths = sorted(set.intersection(*(set(scores[t]) for t in tasks))) if tasks else []
    return {n: sum(scores[t][n] for t in tasks) / len(tasks) for n in lengths}


def average_intervals(average: dict[int, float], samples: dict[str, dict[int, int]], tasks: list[str]):
    """Each length's average with a conservative 95 % interval: Wilson over T x (the fewest prompts of a task) (the
    tasks' means are independent, each of variance p_t (1 - p_t) / n_t <= p_t (1 - p_t) / n_min, and the mean over T
    tasks has variance <= p (1 - p) / (T n_min) by concavity; with equal counts that is all the prompts)."""
    return {n: wilson(value, len(tasks) * min(samples[t][n] for t in tasks)) for n, value in average.items()}


def effective_length(average: dict[int, float], threshold: float) -> int | None:
    """The longest length up to which every evaluated length's average is at least ``threshold``; None when the
    shortest is already below it.

    RULER's definition with its threshold (:data:`RULER_THRESHOLD`): the longest length the model passes. Where the
    average does not fall with length, a length beyond a failing one does not count."""
    best = None
    for length in sorted(average):
        if average[length] < threshold:
            break
        best = length
    return best


def native_score(average: dict[int, float], native_length: int) -> tuple[int, float] | None:
    """(length, average) at the longest evaluated length not beyond ``native_length``; None when none is."""
    within = [n for n in average if n <= native_length]
    return (max(within), average[max(within)]) if within else None
