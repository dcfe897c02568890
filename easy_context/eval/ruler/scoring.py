"""RULER's scores: the share of the expected strings found in the output, averages, and the effective length."""

from __future__ import annotations

from collections import defaultdict


def string_match_all(output: str, answers: list[str]) -> float:
    """RULER's ``string_match_all``: the fraction of ``answers`` that occur in ``output`` (case-insensitive).

    It can only grow as the output grows, so generation may stop once every answer is in it (same score)."""
    text = output.lower()
    return sum(answer.lower() in text for answer in answers) / len(answers)


def all_found(output: str, answers: list[str]) -> bool:
    return string_match_all(output, answers) == 1.0


def table(rows: list[dict], key: str = "score") -> dict[str, dict[int, float]]:
    """Mean ``key`` per task and length: ``{task: {length: mean}}``."""
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in rows:
        cells[(row["task"], int(row["length"]))].append(float(row[key]))
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (task, length), values in sorted(cells.items()):
        out[task][length] = sum(values) / len(values)
    return dict(out)


def averages(scores: dict[str, dict[int, float]], tasks: list[str]) -> dict[int, float]:
    """The mean over ``tasks`` at each length (RULER's "Avg." column); lengths every one of them was scored at."""
    lengths = sorted(set.intersection(*(set(scores[t]) for t in tasks))) if tasks else []
    return {n: sum(scores[t][n] for t in tasks) / len(tasks) for n in lengths}


def effective_length(average: dict[int, float], threshold: float) -> int:
    """The longest length up to which every evaluated length's average is at least ``threshold`` (0: none).

    RULER's definition, with the threshold its Llama-2-7B score at 4K (85.6%); here by default the base model's
    average at its native length."""
    best = 0
    for length in sorted(average):
        if average[length] < threshold:
            break
        best = length
    return best


def native_score(average: dict[int, float], native_length: int) -> tuple[int, float] | None:
    """(length, average) at the longest evaluated length not beyond ``native_length``; None when none is."""
    within = [n for n in average if n <= native_length]
    return (max(within), average[max(within)]) if within else None
