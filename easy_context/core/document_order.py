"""Balancing packed documents over the ranks of a ring: reorder whole documents inside each row.

Under document masking (:mod:`easy_context.core.documents`) every token attends only inside its own document, so the
documents of a packed row are independent: a token's loss term depends on its document's tokens before it and on its
target, nothing else. Moving whole documents (each one's ``input_ids``, ``position_ids`` and ``target_ids`` slices
together, after the inputs/targets shift) to other places in the row therefore leaves every per-token loss term, the
summed loss and every gradient the same (up to float summation order), but changes which rank holds which document.

That matters for the ring backends. Zigzag ring attention cuts the row into 2W chunks (rank r holds chunks r and
2W-1-r) and DistFlashAttn into W; their ring steps run in lockstep, so a step lasts as long as its busiest rank, and
with documents the per-rank work of a step is very uneven (docs/benchmarks.md, "Document masking"). The lockstep
cost of a layout is the sum over the schedule's steps of the busiest rank's work (attention scores of the document
sub-blocks, ``documents.split_blocks`` / ``documents.block_cost``: the same count
``bench/document_imbalance.py`` reports, :func:`schedule_work`). :func:`balance_order` searches a document order that
lowers it and :func:`balance_documents` applies it to a host batch before sharding.

Which backends: ``zigzag_ring_attn`` and ``dist_flash_attn``; ``usp_attn`` with ``ring_degree`` R > 1 (after its
Ulysses all-to-all, ring rank j holds zigzag shard j of the full sequence and the U ranks of a ring index compute the
same blocks on different heads, so its lockstep cost is zigzag's on R ranks). ``ulysses_attn``, ``usp_attn`` with
R = 1 and ``data_parallel`` need no balancing: every rank attends the whole sequence (its share of the heads, or its
own rows), so every rank does the same work whatever the order; other (user-registered) backends have no known
schedule. For those the order is the identity.

Everything here is host-side and deterministic (exact integer arithmetic in float64, fixed tie-breaking), so every SP
rank computes the same order from the same batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .block import Block
from .documents import Documents, block_cost, split_blocks
from .spans import Span, pieces

BALANCED_ALGOS = ("zigzag_ring_attn", "dist_flash_attn", "usp_attn")

# (blocks, query spans, key spans) of one task: the blocks index the runner's local query / key tensors, whose rows
# sit at the spans' global rows (the arguments of :func:`easy_context.core.documents.split_blocks`)
Task = tuple[list[Block], tuple[Span, ...], tuple[Span, ...]]


def ring_world(seq_algo: str, world_size: int, **options) -> int | None:
    """The number of ranks whose lockstep ring a document order can balance for ``seq_algo`` on ``world_size`` SP
    ranks, or None when no order changes the per-rank work (see the module docstring): ``world_size`` for zigzag and
    DistFlashAttn, USP's ring degree (None when it is 1), None for Ulysses, data parallel and unknown schedules."""
    from .registry import get_seq_algo

    get_seq_algo(seq_algo)  # unknown names raise
    if seq_algo in ("zigzag_ring_attn", "dist_flash_attn"):
        return world_size if world_size > 1 else None
    if seq_algo == "usp_attn":
        from ..usp_attn.prepare_inputs import resolve_ring_degree
        from .groups import check_ring_degree

        ring = resolve_ring_degree(world_size, options.get("ring_degree"))
        check_ring_degree(world_size, ring)
        return ring if ring > 1 else None
    return None


def _schedule_algo(seq_algo: str) -> str:
    """The schedule whose steps ``seq_algo``'s ring runs (USP's ring is zigzag's)."""
    return "zigzag_ring_attn" if seq_algo == "usp_attn" else seq_algo


def schedule_tasks(seq_algo: str, world: int, seq_length: int, causal: bool = True) -> list[list[list[Task]]]:
    """``tasks[step][rank]``: what rank ``rank`` computes at ring step ``step`` of ``seq_algo``'s forward on a ring of
    ``world`` ranks over ``seq_length`` global rows (the backward computes the same blocks). ``seq_algo``:
    ``zigzag_ring_attn`` (W steps, one task per rank) or ``dist_flash_attn`` (its balanced schedule, at most one
    task per rank and step); ``usp_attn`` means its zigzag ring (``world`` = the ring degree)."""
    algo = _schedule_algo(seq_algo)
    s = seq_length // world
    if algo == "zigzag_ring_attn":
        from ..zigzag_ring_attn import zigzag_blocks, zigzag_spans

        return [
            [
                [(zigzag_blocks(rank, src, s, causal), zigzag_spans(rank, world, s), zigzag_spans(src, world, s))]
                for rank, src in ((rank, (rank - step) % world) for rank in range(world))
            ]
            for step in range(world)
        ]
    if algo == "dist_flash_attn":
        from ..dist_flash_attn.schedule import build_schedule, task_blocks, task_spans

        out = []
        for step in build_schedule(world, causal):
            row: list[list[Task]] = [[] for _ in range(world)]
            for task in step:
                row[task.runner].append((task_blocks(task, s, causal), *task_spans(task, s)))
            out.append(row)
        return out
    raise ValueError(f"no lockstep schedule for {seq_algo!r}; balanced backends: {', '.join(BALANCED_ALGOS)}")


def schedule_work(
    seq_algo: str, world: int, seq_length: int, documents: Documents | None, causal: bool = True
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


def _terms(tasks: list[list[list[Task]]]) -> list[list[tuple]]:
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


@functools.lru_cache(maxsize=64)
def lockstep_model(seq_algo: str, world: int, seq_length: int, causal: bool = True) -> LockstepModel:
    """The :class:`LockstepModel` of ``seq_algo``'s schedule (:func:`schedule_tasks`) on a ring of ``world`` ranks
    over ``seq_length`` rows (cached: built once per configuration)."""
    terms = _terms(schedule_tasks(seq_algo, world, seq_length, causal))
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


# ------------------------------------------------------------------------------------------------ the search


def _insertions(model: LockstepModel, lengths: np.ndarray, movers: np.ndarray) -> np.ndarray:
    """(len(movers), n, steps * ranks): the work of every (step, rank) of the order ``lengths`` (n documents) after
    moving the document at index ``movers[m]`` to index j (its index in the new order; j = its own index: unchanged).

    Incremental: moving document i to j < i shifts documents j .. i-1 right by its length, to j > i shifts
    i+1 .. j left, so the new work is the old one plus prefix sums of the shifted documents' differences.
    """
    n, m = len(lengths), len(movers)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    w = model.weights
    base = model.doc_work(starts, lengths)  # (n, cells): each document's share of the work
    i = movers[:, None]  # (m, 1)
    lm = lengths[i]
    k = np.arange(n)[None, :]
    # documents before the mover can only shift right (it moves before them), those after it left
    shifted = np.where(k < i, starts + lm, np.where(k > i, starts - lm, starts))
    prefix = np.zeros((m, n + 1, w.shape[1]))  # [:, k]: the change of documents < k, shifted
    np.cumsum(model.doc_work(shifted, np.broadcast_to(lengths, (m, n))) - base, axis=1, out=prefix[:, 1:])
    rows = np.arange(m)[:, None]
    before = k < i  # target index j (= k) before the mover
    out = model.doc_work(np.where(before, starts, ends - lm), np.broadcast_to(lm, (m, n)))
    out += np.where(
        before[..., None],
        prefix[rows, i] - prefix[rows, k],  # documents j .. i-1 moved right
        prefix[rows, k + 1] - prefix[rows, i + 1],  # documents i+1 .. j moved left (none when j == i)
    )
    out += base.sum(axis=0) - base[movers][:, None, :]
    return out


def _lockstep(model: LockstepModel, work: np.ndarray) -> np.ndarray:
    """(...) lockstep cost of (..., steps * ranks) work."""
    return work.reshape(*work.shape[:-1], model.steps, model.ranks).max(axis=-1).sum(axis=-1)


def _move(order: list[int], i: int, j: int) -> list[int]:
    out = order[:i] + order[i + 1 :]
    out.insert(j, order[i])
    return out


_BATCH_ELEMENTS = 1 << 21  # floats per (movers, n, features) array of one batch of candidates (16 MiB)


def _descend(model: LockstepModel, lengths: np.ndarray, order: list[int], movable: np.ndarray, rounds: int):
    """At most ``rounds`` best-improvement moves, each of one document flagged ``movable`` (by document) to any
    other index of ``order``; returns (order, lockstep cost). Ties keep the first (mover, index) found."""
    cost = float(model.cost(model.layout_features(lengths[order])))
    n = len(order)
    per_batch = max(1, _BATCH_ELEMENTS // (n * max(len(model.pairs), model.weights.shape[1])))
    for _ in range(rounds):
        current = lengths[order]
        movers = np.flatnonzero(movable[order])
        best = (cost, -1, -1)
        for lo in range(0, len(movers), per_batch):
            costs = _lockstep(model, _insertions(model, current, movers[lo : lo + per_batch]))  # (m, n)
            m, j = np.unravel_index(int(np.argmin(costs)), costs.shape)
            if costs[m, j] < best[0]:
                best = (float(costs[m, j]), int(movers[lo + m]), int(j))
        if best[1] < 0:
            break
        cost, order = best[0], _move(order, best[1], best[2])
    return order, cost


SEARCH_OPTIONS = ("causal", "long_fraction", "long_rounds", "polish_fraction", "polish_rounds")


def balance_order(
    lengths: Sequence[int],
    seq_algo: str,
    world_size: int,
    *,
    causal: bool = True,
    long_fraction: float = 1.0,
    long_rounds: int = 12,
    polish_fraction: float = 0.5,
    polish_rounds: int = 4,
    **options,
) -> list[int]:
    """A permutation ``order`` of the documents of one packed row (``lengths[d]``: document d's rows, in row order)
    that lowers the lockstep cost of ``seq_algo`` on ``world_size`` SP ranks (``options``: the backend's, e.g.
    ``ring_degree``; ``causal``: the attention's): the row becomes documents ``order[0], order[1], ...``. Never worse
    than the input order (the identity unless the search finds a strictly lower cost); the identity for backends that
    need no balancing (:func:`ring_world`). The row's length must shard (``ValueError`` as the backend's sharding).

    The search (deterministic; about 6 ms on the host for a 128K row of ~70 documents on 8 ranks, ~120 ms for 256K
    on 16, ``bench/document_imbalance.py``); every candidate is scored by the exact lockstep cost
    (:class:`LockstepModel`, the count of :func:`schedule_work`):

    1. Long documents (longer than ``long_fraction`` x the segment length S / (2 W): a zigzag chunk, half a
       DistFlashAttn chunk) carry most of the work and decide which ring steps are busy (under zigzag a document
       over chunks i < j of the first half puts its (i, j) block on rank j at step j - i, one of the second half on
       step W - (j - i)); the others are short. Three arrangements of the short documents are tried: as given,
       ascending and descending by length, each with the long documents in front (longest first).
    2. On each, up to ``long_rounds`` best-improvement moves of one long document to any other index of the order
       (all (document, index) moves scored at once, incrementally: :func:`_insertions`). The long documents end up
       where their busy steps coincide and their blocks land on different ranks, at chunk offsets that balance
       them; the short documents around them fill the remaining chunks.
    3. On the best of the three, up to ``polish_rounds`` best-improvement moves of any document longer than
       ``polish_fraction`` x the segment (the diagonal step's balance and the blocks across chunk boundaries).

    Whole documents only move: a document longer than a chunk stays one contiguous run (it spans chunks).
    """
    lengths_np = np.asarray(lengths, dtype=np.int64)
    n = len(lengths_np)
    if n and lengths_np.min() <= 0:
        raise ValueError(f"document lengths must be positive, got {list(lengths)}")
    identity = list(range(n))
    world = ring_world(seq_algo, world_size, **options)
    if n < 2 or world is None:
        return identity
    from .registry import get_seq_algo

    seq_length = int(lengths_np.sum())
    get_seq_algo(seq_algo).check_length(seq_length, world_size, **options)
    model = lockstep_model(_schedule_algo(seq_algo), world, seq_length, causal)
    lens = lengths_np.astype(np.float64)
    segment = seq_length / (2 * world)
    is_long = lens > long_fraction * segment
    longs = sorted(np.flatnonzero(is_long).tolist(), key=lambda d: (-lens[d], d))
    shorts = np.flatnonzero(~is_long).tolist()
    arrangements = (shorts, sorted(shorts, key=lambda d: (lens[d], d)), sorted(shorts, key=lambda d: (-lens[d], d)))
    best = None
    for arrangement in arrangements:
        order, cost = _descend(model, lens, longs + arrangement, is_long, long_rounds)
        if best is None or cost < best[1]:
            best = (order, cost)
    order, cost = _descend(model, lens, best[0], lens > polish_fraction * segment, polish_rounds)
    return order if cost < float(model.cost(model.layout_features(lens))) else identity


def lockstep_cost(lengths: Sequence[int], seq_algo: str, world_size: int, causal: bool = True, **options) -> int:
    """The lockstep cost (sum over ring steps of the busiest rank's work, in attention scores) of a row holding
    documents of ``lengths`` in that order under ``seq_algo`` on ``world_size`` SP ranks; 0 for backends without a
    ring to balance (:func:`ring_world`)."""
    world = ring_world(seq_algo, world_size, **options)
    if world is None:
        return 0
    return lockstep_model(_schedule_algo(seq_algo), world, int(sum(lengths)), causal).lockstep(lengths)


# ------------------------------------------------------------------------------------------------ batches


def row_documents(position_ids: torch.Tensor | np.ndarray) -> list[int]:
    """Document lengths of one (seq,) row of position ids by transformers' rule, as :func:`find_documents`: a token
    whose position is not the previous one's plus one starts a document, whatever position the row starts at."""
    pos = np.asarray(position_ids.detach().cpu() if isinstance(position_ids, torch.Tensor) else position_ids)
    bounds = [0, *(np.flatnonzero(np.diff(pos) != 1) + 1).tolist(), len(pos)]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def balance_documents(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    target_ids: torch.Tensor | None,
    seq_algo: str,
    world_size: int,
    **options,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The (batch, seq) host batch with the whole documents of each row reordered by :func:`balance_order`; call it
    on the full batch before sharding (``prepare_seq_parallel_inputs``), on every SP rank (all get the same order).

    ``input_ids``, ``position_ids``, ``target_ids``: (batch, seq) full-sequence tensors, targets already shifted
    (``target_ids[b, t]`` is the target of ``input_ids[b, t]``, as train.py's ``split_batch`` gives them; -100s are
    fine; None: no targets). Each row is gathered with one permutation of its columns for all three tensors, so every
    token keeps its position id and its target; each row gets its own order. Documents come from ``position_ids``
    (:func:`row_documents`); a document keeps its position ids exactly, and a row only moves when the new row has
    exactly the moved documents again (one whose first position continued the last position of the document now
    before it would merge with it: such a row keeps its order), so the backends' document detection after the move
    finds the same documents. ``seq_algo``, ``world_size``, ``options``: as for ``prepare_seq_parallel_inputs``
    (e.g. ``ring_degree``), plus :func:`balance_order`'s search options (:data:`SEARCH_OPTIONS`).

    Returns (input_ids, position_ids, target_ids): new tensors when a row moved, else the inputs themselves
    (position_ids None, one document per row, an order that is already best, or a backend that needs no balancing).
    Exact under document masking for models whose only mixing across tokens is attention (the models the backends
    patch): the loss of every token, their sum and every gradient equal the original batch's, up to float summation
    order.
    """
    if position_ids is None:
        return input_ids, position_ids, target_ids
    if input_ids.dim() != 2 or position_ids.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and position_ids must be (batch, seq) of one shape, got {tuple(input_ids.shape)} and "
            f"{tuple(position_ids.shape)}"
        )
    if target_ids is not None and target_ids.shape != input_ids.shape:
        raise ValueError(
            f"target_ids must have input_ids' shape {tuple(input_ids.shape)}, got {tuple(target_ids.shape)}"
        )
    backend = {k: v for k, v in options.items() if k not in SEARCH_OPTIONS}
    if ring_world(seq_algo, world_size, **backend) is None:
        return input_ids, position_ids, target_ids
    rows = position_ids.detach().cpu().numpy()
    perms: dict[int, list[tuple[int, int]]] = {}
    for b, row in enumerate(rows):
        lengths = row_documents(row)
        order = balance_order(lengths, seq_algo, world_size, **options)
        if order == list(range(len(lengths))):
            continue
        starts = np.cumsum([0, *lengths[:-1]])
        first, last = row[starts], row[starts + np.asarray(lengths) - 1]
        if any(first[b_] == last[a_] + 1 for a_, b_ in zip(order, order[1:])):
            continue  # a document would continue the one placed before it: they would merge
        perms[b] = [(int(starts[d]), lengths[d]) for d in order]  # the new row: these (start, length) runs
    if not perms:
        return input_ids, position_ids, target_ids

    def gather(t: torch.Tensor | None) -> torch.Tensor | None:
        """``t`` with the moved rows' runs in their new order: numpy slice copies on the host (no intra-op threads,
        no index tensor; a device tensor comes back on its device)."""
        if t is None:
            return None
        src = t.detach().cpu().numpy()
        out = src.copy()
        for b, runs in perms.items():
            at = 0
            for start, n in runs:
                out[b, at : at + n] = src[b, start : start + n]
                at += n
        return torch.from_numpy(out).to(t.device)

    return gather(input_ids), gather(position_ids), gather(target_ids)
