"""The lockstep cost of a ring schedule over a row of packed documents: what :mod:`.document_order` lowers.

A ring backend's steps run in lockstep: a step lasts as long as its busiest rank, and with documents the per-rank
work of a step is very uneven (docs/benchmarks.md, "Document masking"). The lockstep cost of a layout is the sum over
the schedule's steps of the busiest rank's work (attention scores of the document sub-blocks,
``documents.split_blocks`` / ``documents.block_cost``: the same count ``bench/document_imbalance.py`` reports,
:func:`schedule_work`). :class:`LockstepModel` computes it exactly as a linear function of where the documents lie,
fast enough to score every candidate order of a search.

Which backends: those that declare a :class:`~easy_context.core.ring_schedule.RingSchedule` (its ring size for the
SP size and options, and its blocks per step and rank); this module never names one. Everything is exact integer
arithmetic in float64, so every SP rank computes the same costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from easy_context.core.documents import Documents, block_cost, split_blocks
from easy_context.core.registry import get_seq_algo
from easy_context.core.ring_schedule import Tasks
from easy_context.core.seq_algo import REGISTERED, SeqAlgo
from easy_context.core.spans import pieces

# ------------------------------------------------------------------------------------------------ the schedules


def ring_world(seq_algo: SeqAlgo | str, world_size: int, **options) -> int | None:
    """The number of ranks whose lockstep ring a document order can balance for ``seq_algo`` on ``world_size`` SP
    ranks (its :class:`~easy_context.core.ring_schedule.RingSchedule`), or None when no order changes the per-rank
    work: backends without a lockstep ring (every rank attends the whole sequence, or no schedule is known)."""
    schedule = get_seq_algo(seq_algo).ring_schedule
    return None if schedule is None else schedule.ring_size(world_size, **options)


def schedule_tasks(seq_algo: SeqAlgo | str, world: int, seq_length: int, causal: bool = True) -> Tasks:
    """``tasks[step][rank]``: what rank ``rank`` computes at ring step ``step`` of ``seq_algo``'s forward on a ring of
    ``world`` ranks over ``seq_length`` global rows (the backward computes the same blocks)."""
    algo = get_seq_algo(seq_algo)
    if algo.ring_schedule is None:
        balanced = ", ".join(a.name for a in REGISTERED.values() if a.ring_schedule is not None)
        raise ValueError(f"no lockstep schedule for {algo.name!r}; balanced backends: {balanced}")
    return algo.ring_schedule.tasks(world, seq_length, causal)


def schedule_work(
    seq_algo: SeqAlgo | str, world: int, seq_length: int, documents: Documents | None, causal: bool = True
) -> tuple[list[list[int]], list[int]]:
    """(``work[step][rank]``, kernel calls per rank) of ``seq_algo``'s forward on a ring of ``world`` ranks: the
    attention scores of every document sub-block (:func:`~.documents.split_blocks`, one batch row;
    :func:`~easy_context.core.documents.block_cost`). The exact count, straight from the schedule's blocks."""
    tasks = schedule_tasks(seq_algo, world, seq_length, causal)
    work = [[0] * world for _ in tasks]
    calls = [0] * world
    for t, row in enumerate(tasks):
        for rank, items in enumerate(row):
            for blocks, q_spans, k_spans in items:
                split = split_blocks(blocks, q_spans, k_spans, documents, 1)
                work[t][rank] += sum(block_cost(b) for b in split)
                calls[rank] += len(split)
    return work, calls


def summarize_work(work: Sequence[Sequence[int]], calls: Sequence[int] | None = None) -> dict:
    """Totals of a ``work[step][rank]`` table: ``work`` (all ranks), ``lockstep`` (sum over steps of the busiest
    rank's work: the time of steps run in lockstep), ``imbalance`` (busiest rank's total / mean total - 1),
    ``step_efficiency`` (mean total / lockstep: 1.0 is balanced) and, given ``calls``, kernel calls per rank."""
    world = len(work[0])
    totals = [sum(step[r] for step in work) for r in range(world)]
    mean = sum(totals) / world
    lockstep = sum(max(step) for step in work)
    out = {
        "work": sum(totals),
        "lockstep": lockstep,
        "imbalance": max(totals) / mean - 1 if mean else 0.0,
        "step_efficiency": mean / lockstep if lockstep else 1.0,
    }
    if calls is not None:
        out["kernel_calls_max"] = max(calls)
        out["kernel_calls_mean"] = sum(calls) / world
    return out


# ------------------------------------------------------------------------------------------------ the cost model


@dataclass(frozen=True)
class LockstepModel:
    """The per-(step, rank) work of a schedule as a linear function of where the documents lie.

    The schedule's span edges cut the global rows into segments (``bounds``, ascending, ``bounds[0] = 0``,
    ``bounds[-1] = seq_length``). Every sub-block of :func:`~.documents.split_blocks` is a causal square
    or a rectangle of rows of one document, so with ``a[d, i]`` = the rows document d has in segment i, a rank's work
    at a step is a sum of ``sum_d a[d, i] * a[d, j]`` (a rectangle between segments i and j) and
    ``sum_d a[d, i] (a[d, i] + 1) / 2`` (a causal square inside segment i) terms: the F features. ``pairs`` (F, 2):
    the segments (i, j) of each feature, the first ``squares`` of them the causal-square terms (i, i), the others
    the products (i <= j). ``weights`` (F, steps * ranks): how often each feature enters each (step, rank) cell's
    work; ``near``: the same weights regrouped for documents within two adjacent segments (:meth:`doc_work`). All
    values are integers, exact in float64 (every sum stays far below 2^53 for sequences below 2^25 rows), so costs
    compare exactly, whatever the summation order, and every rank computes the same ones.
    """

    steps: int
    ranks: int
    bounds: np.ndarray
    pairs: np.ndarray
    squares: int
    weights: np.ndarray
    near: np.ndarray  # (3, segments + 1, steps * ranks)

    def doc_work(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(..., steps * ranks) work of documents of ``lengths`` rows starting at global row ``starts`` (same
        shapes), each alone: ``features @ weights``, computed without the F features for the documents inside one
        segment or two adjacent ones (nearly all of a row's): with a1 / a2 rows in the first / next segment i /
        i+1, their work is ``sq(a1) near[0, i] + sq(a2) near[0, i+1] + a1 a2 near[1, i] + (a1^2 near[2, i] +
        a2^2 near[2, i+1])`` (sq(a) = a (a + 1) / 2: causal squares; near[2]: the products of a segment with
        itself, non-causal only)."""
        starts = np.asarray(starts, dtype=np.float64)
        lengths = np.asarray(lengths, dtype=np.float64)
        ends = starts + lengths
        first = np.searchsorted(self.bounds, starts, side="right") - 1
        last = np.searchsorted(self.bounds, ends - 1.0, side="right") - 1
        a1 = np.minimum(ends, self.bounds[first + 1]) - starts
        a2 = lengths - a1
        work = (a1 * (a1 + 1.0) / 2.0)[..., None] * self.near[0, first]
        work += (a2 * (a2 + 1.0) / 2.0)[..., None] * self.near[0, first + 1]
        work += (a1 * a2)[..., None] * self.near[1, first]
        if self.near[2].any():
            work += (a1 * a1)[..., None] * self.near[2, first] + (a2 * a2)[..., None] * self.near[2, first + 1]
        wide = np.nonzero(last - first >= 2)  # over three or more segments: the general way
        if len(wide[0]):
            work[wide] = self.features(starts[wide], lengths[wide]) @ self.weights
        return work

    def features(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(..., F) features of documents of ``lengths`` rows starting at global row ``starts`` (same shapes)."""
        starts = np.asarray(starts, dtype=np.float64)
        ends = starts + np.asarray(lengths, dtype=np.float64)
        a = np.minimum(ends[..., None], self.bounds[1:]) - np.maximum(starts[..., None], self.bounds[:-1])
        np.maximum(a, 0.0, out=a)
        sq = a[..., self.pairs[: self.squares, 0]]
        out = np.empty((*a.shape[:-1], len(self.pairs)))
        np.multiply(sq, sq + 1.0, out=out[..., : self.squares])
        out[..., : self.squares] *= 0.5
        np.multiply(a[..., self.pairs[self.squares :, 0]], a[..., self.pairs[self.squares :, 1]],
                    out=out[..., self.squares :])  # fmt: skip
        return out

    def step_work(self, features: np.ndarray) -> np.ndarray:
        """(..., steps, ranks) work from summed (..., F) features."""
        return (features @ self.weights).reshape(*features.shape[:-1], self.steps, self.ranks)

    def cost(self, features: np.ndarray) -> np.ndarray:
        """(...) lockstep cost (sum over steps of the busiest rank's work) from summed (..., F) features."""
        return self.step_work(features).max(axis=-1).sum(axis=-1)

    def layout_features(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """(..., F) summed features of rows holding documents of (..., n) ``lengths`` in that order."""
        lengths = np.asarray(lengths, dtype=np.float64)
        starts = np.cumsum(lengths, axis=-1) - lengths
        return self.features(starts, lengths).sum(axis=-2)

    def work(self, lengths: Sequence[int]) -> list[list[int]]:
        """``work[step][rank]`` of one row holding documents of ``lengths`` in that order (= :func:`schedule_work`)."""
        return self.step_work(self.layout_features(lengths)).astype(np.int64).tolist()

    def lockstep(self, lengths: Sequence[int]) -> int:
        """The lockstep cost of one row holding documents of ``lengths`` in that order."""
        return int(self.cost(self.layout_features(lengths)))


def _terms(tasks: Tasks) -> list[list[tuple]]:
    """Per (step, rank) cell: its sub-block kinds in global rows, the cases of ``documents._split_one``:
    ``("square", a, b)`` a causal square over rows a .. b-1, ``("rect", qa, qb, ka, kb)`` a full rectangle."""
    terms = []
    for row in tasks:
        for items in row:
            cell = []
            for blocks, q_spans, k_spans in items:
                for blk in blocks:
                    for q in pieces(blk.q_rows, q_spans):
                        for k in pieces(blk.k_rows, k_spans):
                            q_end, k_end = q.start + q.length, k.start + k.length
                            if blk.causal and q == k:
                                cell.append(("square", q.start, q_end))
                            elif blk.causal and k.start >= q_end:  # keys after the queries: nothing
                                continue
                            elif blk.causal and k_end > q.start:
                                raise ValueError(f"causal block {blk}: key rows {k} overlap query rows {q} partially")
                            else:
                                cell.append(("rect", q.start, q_end, k.start, k_end))
            terms.append(cell)
    return terms


def lockstep_model(seq_algo: SeqAlgo | str, world: int, seq_length: int, causal: bool = True) -> LockstepModel:
    """The :class:`LockstepModel` of ``seq_algo``'s schedule (:func:`schedule_tasks`) on a ring of ``world`` ranks
    over ``seq_length`` rows (cached per schedule: backends that run the same ring share one)."""
    algo = get_seq_algo(seq_algo)
    if algo.ring_schedule is None:
        schedule_tasks(algo, world, seq_length, causal)  # raises, naming the backends that have one
    return _lockstep_model(algo.ring_schedule.tasks, world, seq_length, causal)


@functools.lru_cache(maxsize=64)
def _lockstep_model(
    tasks: Callable[[int, int, bool], Tasks], world: int, seq_length: int, causal: bool
) -> LockstepModel:
    terms = _terms(tasks(world, seq_length, causal))
    cuts = {0, seq_length}
    for cell in terms:
        for term in cell:
            cuts.update(term[1:])
    bounds = np.array(sorted(cuts), dtype=np.float64)

    def segments(a: int, b: int) -> list[int]:
        return list(range(int(np.searchsorted(bounds, a)), int(np.searchsorted(bounds, b))))

    # feature (i, j, square) -> {cell: count}; rectangles fold to i <= j (the products are symmetric)
    uses: dict[tuple[int, int, bool], dict[int, int]] = {}
    for c, cell in enumerate(terms):
        for term in cell:
            if term[0] == "square":  # over segments i1 .. ik: each one's square plus every pair of them
                segs = segments(term[1], term[2])
                keys = [(i, i, True) for i in segs] + [(i, j, False) for x, i in enumerate(segs) for j in segs[x + 1 :]]
            else:
                keys = [(min(i, j), max(i, j), False) for i in segments(*term[1:3]) for j in segments(*term[3:5])]
            for key in keys:
                counts = uses.setdefault(key, {})
                counts[c] = counts.get(c, 0) + 1
    keys = sorted(uses, key=lambda key: (not key[2], key[0], key[1]))  # the squares first
    weights = np.zeros((len(keys), len(terms)), dtype=np.float64)
    for f, key in enumerate(keys):
        for c, count in uses[key].items():
            weights[f, c] = count
    pairs = np.array([(i, j) for i, j, _ in keys], dtype=np.int64).reshape(-1, 2)
    n = len(bounds) - 1
    near = np.zeros((3, n + 1, len(terms)), dtype=np.float64)  # one zero row past the last segment
    for f, (i, j, square) in enumerate(keys):
        if square:
            near[0, i] = weights[f]
        elif j == i + 1:
            near[1, i] = weights[f]
        elif j == i:
            near[2, i] = weights[f]
    for array in (bounds, pairs, weights, near):
        array.setflags(write=False)
    return LockstepModel(len(terms) // world, world, bounds, pairs, sum(key[2] for key in keys), weights, near)


def lockstep_cost(
    lengths: Sequence[int], seq_algo: SeqAlgo | str, world_size: int, causal: bool = True, **options
) -> int:
    """The lockstep cost (sum over ring steps of the busiest rank's work, in attention scores) of a row holding
    documents of ``lengths`` in that order under ``seq_algo`` on ``world_size`` SP ranks; 0 for backends without a
    ring to balance (:func:`ring_world`)."""
    world = ring_world(seq_algo, world_size, **options)
    if world is None:
        return 0
    return lockstep_model(seq_algo, world, int(sum(lengths)), causal).lockstep(lengths)
