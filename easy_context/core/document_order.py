"""Balancing packed documents over the ranks of a ring: reorder whole documents inside each row.

Under document masking (:mod:`easy_context.core.documents`) every token attends only inside its own document, so the
documents of a packed row are independent: a token's loss term depends on its document's tokens before it and on its
target, nothing else. Moving whole documents (each one's ``input_ids``, ``position_ids`` and ``target_ids`` slices
together, after the inputs/targets shift) to other places in the row therefore leaves every per-token loss term, the
summed loss and every gradient the same (up to float summation order), but changes which rank holds which document.

That matters for the ring backends whose steps run in lockstep: a step lasts as long as its busiest rank, and with
documents the per-rank work of a step is very uneven (docs/benchmarks.md, "Document masking"). The lockstep cost of a
layout (the sum over the schedule's steps of the busiest rank's work) is :mod:`.lockstep`'s cost model;
:func:`balance_order` searches a document order that lowers it and :func:`balance_documents` applies it to a host
batch before sharding. The cost model's functions are importable from here too.

Which backends: those that declare a :class:`~easy_context.core.ring_schedule.RingSchedule` (its ring size for the
SP size and options, and its blocks per step and rank); this module never names one. Backends without one (every
rank attends the whole sequence, its share of the heads or its own rows, or no schedule is known) need no
balancing: the order is the identity.

Everything here is host-side and deterministic (exact integer arithmetic in float64, fixed tie-breaking), so every SP
rank computes the same order from the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from easy_context.core.lockstep import (
    LockstepModel,
    lockstep_cost,
    lockstep_model,
    ring_world,
    schedule_tasks,
    schedule_work,
    summarize_work,
)
from easy_context.core.seq_algo import SeqAlgo

__all__ = [
    "SEARCH_OPTIONS",
    "LockstepModel",
    "balance_documents",
    "balance_order",
    "lockstep_cost",
    "lockstep_model",
    "ring_world",
    "row_documents",
    "schedule_tasks",
    "schedule_work",
    "summarize_work",
]


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
    seq_algo: SeqAlgo | str,
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
    from easy_context.core.registry import get_seq_algo

    seq_length = int(lengths_np.sum())
    get_seq_algo(seq_algo).check_length(seq_length, world_size, **options)
    model = lockstep_model(seq_algo, world, seq_length, causal)
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
    seq_algo: SeqAlgo | str,
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
