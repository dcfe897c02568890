"""Figures: the needle heatmap (token limit x depth, red -> yellow -> green) and perplexity vs context length."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from easy_context.eval.results import cell_scores  # noqa: E402

SCORE_CMAP = LinearSegmentedColormap.from_list("needle_score", ["#F0496E", "#EBB839", "#0CD79F"])
_ANNOTATE_MAX_CELLS = 400
_MAX_LENGTH_LABELS = 16  # x tick labels of a heatmap; more columns than this are not annotated either


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _heatmap(fig, ax, rows: Sequence[Mapping], key: str = "correct", mark_length: int | None = None) -> float:
    """Draw the mean of ``key`` per cell on ``ax`` (x: token limit, y: depth percent, 0 at the top); a dashed line
    after the last length <= ``mark_length``. Returns the mean score."""
    scores = cell_scores(list(rows), key)
    if not scores:
        raise ValueError("no needle results to plot")
    depths = sorted({d for d, _ in scores})
    lengths = sorted({n for _, n in scores})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for (depth, length), value in scores.items():
        grid[depths.index(depth), lengths.index(length)] = value
    image = ax.imshow(grid, cmap=SCORE_CMAP, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="Score")
    every = -(-len(lengths) // _MAX_LENGTH_LABELS)  # past that many columns, label every k-th (else they overlap)
    ax.set_xticks(range(0, len(lengths), every), [str(n) for n in lengths[::every]], rotation=45, ha="right")
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("Token Limit")
    ax.set_ylabel("Depth Percent")
    if grid.size <= _ANNOTATE_MAX_CELLS and len(lengths) <= _MAX_LENGTH_LABELS:
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2g}", ha="center", va="center", fontsize=8, color="black")
    inside = [n for n in lengths if mark_length is not None and n <= mark_length]
    if inside and len(inside) < len(lengths):
        ax.axvline(len(inside) - 0.5, color="black", linestyle="--", linewidth=1.5)
    return float(np.nanmean(grid))


def needle_heatmap(rows: Sequence[Mapping], path: str, title: str | None = None, key: str = "correct") -> str:
    """Save the mean of ``key`` per cell as a heatmap (x: token limit, y: depth percent, 0 at the top); returns path."""
    cells = len(cell_scores(list(rows), key)) or 1
    lengths = len({int(r["length"]) for r in rows}) or 1
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * lengths + 3), max(4.0, 0.45 * (cells // lengths) + 2)))
    mean = _heatmap(fig, ax, rows, key)
    ax.set_title(f"{title + ': ' if title else ''}needle retrieval (mean {mean:.2f})")
    fig.tight_layout()
    return _save(fig, path)


def _ppl_axes(ax, series: Mapping[str, Sequence[tuple[int, float]]], log_y: bool) -> None:
    ticks: set[int] = set()
    for label, points in series.items():
        points = sorted(points)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ticks.update(xs)
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)], rotation=45, ha="right")
    ax.minorticks_off()
    if log_y:
        ax.set_yscale("log")
        # plain numbers (300, 1000), not 3x10^2; matplotlib still picks which minor ticks get a label
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("Perplexity")
    ax.grid(True, alpha=0.3)


def _no_results(ax, title: str) -> None:
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, "no results (stage did not run)", ha="center", va="center", transform=ax.transAxes)


def extension_figure(
    before: Sequence[Mapping],
    after: Sequence[Mapping],
    ppl: Mapping[str, Sequence[tuple[int, float]]],
    base_length: int,
    path: str,
) -> str:
    """One figure of a context extension: needle heatmaps before | after, perplexity vs length of both models,
    the base (training) length marked in each panel; returns path."""
    fig, axes = plt.subplots(1, 3, figsize=(19, 5), gridspec_kw={"width_ratios": [1.15, 1.15, 1]})
    for ax, rows, name in ((axes[0], before, "before"), (axes[1], after, "after")):
        if not rows:  # a stage that did not run (a time-limited demo's partial summary)
            _no_results(ax, f"{name} extension: needle retrieval")
            continue
        mean = _heatmap(fig, ax, rows, mark_length=base_length)
        ax.set_title(f"{name} extension: needle retrieval (mean {mean:.2f})")
    if not any(ppl.values()):
        _no_results(axes[2], "Perplexity vs context length")
        fig.tight_layout()
        return _save(fig, path)
    _ppl_axes(axes[2], ppl, log_y=True)
    axes[2].axvline(base_length, color="black", linestyle="--", linewidth=1.5, label=f"base length {base_length}")
    axes[2].set_title("Perplexity vs context length")
    axes[2].legend()
    fig.tight_layout()
    return _save(fig, path)


def ppl_plot(
    series: Mapping[str, Sequence[tuple[int, float]]], path: str, title: str | None = None, log_y: bool = False
) -> str:
    """Save perplexity vs context length, one line per label of ``series`` ({label: [(tokens, ppl), ...]})."""
    if not series:
        raise ValueError("no perplexity results to plot")
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    _ppl_axes(ax, series, log_y)
    ax.set_title(title or "Perplexity vs context length")
    ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def ruler_figure(scores: Mapping[str, Mapping[int, float]], average: Mapping[int, float], path: str,
                 title: str | None = None, threshold: float | None = None) -> str:  # fmt: skip
    """RULER results: a tasks x lengths heatmap of scores (0..1) and the average over the tasks vs length, with the
    effective-length threshold as a dashed line."""
    tasks = list(scores)
    lengths = sorted({n for row in scores.values() for n in row})
    if not tasks or not lengths:
        raise ValueError("no RULER results to plot")
    grid = np.full((len(tasks), len(lengths)), np.nan)
    for i, task in enumerate(tasks):
        for j, length in enumerate(lengths):
            if length in scores[task]:
                grid[i, j] = scores[task][length]
    fig, (ax, curve) = plt.subplots(1, 2, figsize=(6 + 0.7 * len(lengths), 1.5 + 0.38 * len(tasks)),
                                    gridspec_kw={"width_ratios": [max(len(lengths), 2), 3]})  # fmt: skip
    image = ax.imshow(grid, cmap=SCORE_CMAP, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="Score")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45, ha="right")
    ax.set_yticks(range(len(tasks)), tasks)
    ax.set_xlabel("Prompt tokens")
    for i in range(len(tasks)):
        for j in range(len(lengths)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7, color="black")
    if average:
        xs = sorted(average)
        curve.plot(xs, [average[n] for n in xs], marker="o", color="#1f77b4", label="average")
        curve.set_xscale("log", base=2)
        curve.set_xticks(xs, [f"{n // 1024}K" if n >= 1024 else str(n) for n in xs], rotation=45)
        curve.minorticks_off()
    if threshold is not None:
        curve.axhline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:.2f}")
    curve.set_ylim(0, 1.02)
    curve.set_xlabel("Prompt tokens")
    curve.set_ylabel("Average score")
    curve.legend(loc="lower left", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
