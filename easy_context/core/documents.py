"""Document masking: several documents packed into one sequence, each attending only to its own tokens.

The rule is transformers' (``masking_utils.find_packed_sequence_indices``): inside a batch row, a token whose
position id is not the previous token's plus one starts a new document (``position_ids`` restarting at 0 at each
document start, as packing collators write them). transformers applies it per batch row, only when the model gets
no ``attention_mask`` and no KV cache (the sequence-parallel models never use one).

No kernel needs a mask for this. Documents are contiguous runs of the global sequence, and every block a schedule
computes (:class:`~easy_context.core.blockwise.Block`) maps its local rows to a few contiguous global runs
(:class:`Span`, answered by the backend's layout: :meth:`~.seq_algo.SeqAlgo.global_rows`). Under document
masking a block becomes one sub-block per document overlapping both its query and its key rows
(:func:`split_blocks`): a causal (diagonal) block gives each document its causal square, a full block gives the
rectangle (queries in the document) x (keys in the document). Blocks without a shared document make no kernel call.
That is exact with every kernel, forward and backward (the backward gets the final merged out/LSE of the rows).

When every row is one document nothing changes: :func:`find_documents` returns None and no block is split.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from easy_context.core.block import ALL, Block
from easy_context.core.spans import Span, pieces
from easy_context.core.windows import window_blocks


@dataclass(frozen=True)
class Documents:
    """The documents of a packed batch whose full (global) sequence has ``length`` tokens.

    ``starts[r]``: the ascending global rows where the documents of batch row r start (the first is 0). One entry
    when every batch row has the same documents (batch 1, or identical rows): it then applies to all rows.
    """

    length: int
    starts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if self.length < 1 or not self.starts:
            raise ValueError(f"Documents need a length >= 1 and at least one row, got {self.length}, {self.starts}")
        for row in self.starts:
            if not row or row[0] != 0 or any(b <= a for a, b in zip(row, row[1:])) or row[-1] >= self.length:
                raise ValueError(
                    f"document starts must begin at 0, increase and stay below the length {self.length}: {row}"
                )

    @property
    def rows(self) -> int:
        return len(self.starts)

    def row_groups(self, batch: int) -> list[tuple[slice, tuple[int, ...]]]:
        """(batch slice, document starts) covering ``batch`` rows: all at once when the rows share documents."""
        if self.rows == 1:
            return [(ALL, self.starts[0])]
        if self.rows != batch:
            raise ValueError(f"documents describe {self.rows} batch rows but the batch has {batch}")
        return [(slice(r, r + 1), starts) for r, starts in enumerate(self.starts)]

    def lengths(self) -> list[list[int]]:
        """Document lengths per row."""
        return [[b - a for a, b in zip(row, [*row[1:], self.length])] for row in self.starts]

    def check(self, algo: str, full_length: int, batch: int) -> None:
        """``ValueError`` unless these documents describe a batch of ``batch`` rows of ``full_length`` tokens."""
        if self.length != full_length:
            raise ValueError(
                f"{algo}: the documents describe a sequence of {self.length} tokens but attention runs over "
                f"{full_length}; documents are global: derive them from the full sequence's position_ids"
            )
        if self.rows not in (1, batch):
            raise ValueError(f"{algo}: documents for {self.rows} batch rows, but the batch has {batch} rows")


def find_documents(position_ids: torch.Tensor) -> Documents | None:
    """The documents of (batch, seq) (or (seq,)) global ``position_ids`` by transformers' rule; None when every
    row is one document (positions increase by exactly 1: nothing to mask)."""
    pos = position_ids.reshape(1, -1) if position_ids.dim() == 1 else position_ids
    if pos.dim() != 2:
        raise ValueError(f"position_ids must be (batch, seq) or (seq,), got shape {tuple(position_ids.shape)}")
    breaks = torch.diff(pos, dim=-1) != 1
    if not bool(breaks.any()):
        return None
    rows = []
    for r in range(pos.shape[0]):
        rows.append((0, *(breaks[r].nonzero().flatten() + 1).tolist()))
    starts = (rows[0],) if all(row == rows[0] for row in rows) else tuple(rows)
    return Documents(pos.shape[1], starts)


def documents_from_cu_seqlens(cu_seqlens: torch.Tensor | Sequence[int]) -> Documents | None:
    """Documents of one packed row from flash-attention's cumulative lengths ``[0, l0, l0 + l1, ..., S]``
    (transformers' ``cu_seq_lens_q``); None for a single document."""
    cu = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    if len(cu) < 2 or cu[0] != 0 or any(b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and increase, got {cu}")
    return None if len(cu) == 2 else Documents(cu[-1], (tuple(cu[:-1]),))


def _doc(starts: Sequence[int], row: int) -> int:
    return bisect.bisect_right(starts, row) - 1


def _split_one(blk: Block, q_spans, k_spans, starts: Sequence[int], length: int, batch: slice) -> list[Block]:
    qp, kp = pieces(blk.q_rows, q_spans), pieces(blk.k_rows, k_spans)
    if not qp or not kp:
        return []
    lo = min(p.start for p in qp + kp)
    hi = max(p.start + p.length for p in qp + kp) - 1
    if _doc(starts, lo) == _doc(starts, hi):  # inside one document: the block as it is
        return [replace(blk, batch=batch)]
    out = []
    for q in qp:
        q_end = q.start + q.length
        for k in kp:
            k_end = k.start + k.length
            if blk.causal and q == k:  # a diagonal piece: each document's causal square
                for i in range(_doc(starts, q.start), _doc(starts, q_end - 1) + 1):
                    a = max(starts[i], q.start)
                    b = min(starts[i + 1] if i + 1 < len(starts) else length, q_end)
                    rows = slice(q.local + a - q.start, q.local + b - q.start)
                    out.append(Block(rows, rows, True, batch))
                continue
            if blk.causal:  # local order follows global order: keys wholly before the queries, or none of them
                if k.start >= q_end:
                    continue
                if k_end > q.start:
                    raise ValueError(f"causal block {blk} has key rows {k} overlapping query rows {q} partially")
            first = max(_doc(starts, q.start), _doc(starts, k.start))
            last = min(_doc(starts, q_end - 1), _doc(starts, k_end - 1))
            for i in range(first, last + 1):
                end = starts[i + 1] if i + 1 < len(starts) else length
                qa, qb = max(starts[i], q.start), min(end, q_end)
                ka, kb = max(starts[i], k.start), min(end, k_end)
                out.append(Block(slice(q.local + qa - q.start, q.local + qb - q.start),
                                 slice(k.local + ka - k.start, k.local + kb - k.start), False, batch))  # fmt: skip
    return out


def split_blocks(
    blocks: Sequence[Block],
    q_spans: Sequence[Span],
    k_spans: Sequence[Span],
    documents: Documents | None,
    batch: int,
    window: int | None = None,
) -> list[Block]:
    """The sub-blocks of ``blocks`` under ``documents`` and a causal sliding ``window`` (``blocks`` itself when both
    are None; the window's rule: :func:`easy_context.core.windows.window_blocks`, applied to the document sub-blocks).

    ``q_spans`` / ``k_spans``: the global rows of the local query / key tensor's rows (the blocks' ``q_rows`` and
    ``k_rows`` index those tensors); ``batch``: the batch size (documents that differ between rows split per row).
    A causal block's rows must be its own keys' rows (the square diagonal blocks the schedules build). Host-side,
    O(documents overlapping each block); a block inside one document is returned unchanged.
    """
    out = list(blocks)
    if documents is not None:
        out = []
        for rows, starts in documents.row_groups(batch):
            for blk in blocks:
                out.extend(_split_one(blk, q_spans, k_spans, starts, documents.length, rows))
    if window is not None:
        out = window_blocks(out, q_spans, k_spans, window)
    return out


def block_cost(blk: Block) -> int:
    """Score entries a block computes (a causal block of n rows: n (n + 1) / 2)."""
    n, m = blk.q_rows.stop - blk.q_rows.start, blk.k_rows.stop - blk.k_rows.start
    return n * (n + 1) // 2 if blk.causal else n * m


# ------------------------------------------------------------------------------------------------ from position_ids


def _comm_device(group, t: torch.Tensor) -> torch.device:
    """Where a tensor for a collective of ``group`` must live: the host for gloo, else a GPU."""
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return t.device if t.device.type != "cpu" else torch.device("cuda", torch.cuda.current_device())


def _agree_on_shape(algo: str, pos: torch.Tensor, group) -> None:
    """Every rank raises together unless every rank's local position_ids have the same shape (all_gather needs it)."""
    mine = torch.tensor([pos.shape[0], pos.shape[1]], dtype=torch.int64, device=_comm_device(group, pos))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    shapes = [tuple(t.tolist()) for t in every]
    if len(set(shapes)) != 1:
        raise ValueError(
            f"{algo}: every rank must pass local position_ids of the same shape (its shard of the full sequence's), "
            f"got {shapes}"
        )


def gather_position_ids(algo, local_position_ids: torch.Tensor, group=None, **options) -> torch.Tensor:
    """The full sequence's (batch, seq) position ids from every SP rank's local shard (one all-gather), in global
    order (each rank's rows placed by the backend's layout, :meth:`~easy_context.core.seq_algo.SeqAlgo.global_rows`).

    ``algo``: the backend (a :class:`~easy_context.core.seq_algo.SeqAlgo`: ``name``, ``distributed``,
    ``global_rows``; callers holding a name ask :func:`~easy_context.core.registry.get_seq_algo`)."""
    from easy_context.core.groups import get_sp_group

    seq_algo = algo.name
    pos = local_position_ids.reshape(1, -1) if local_position_ids.dim() == 1 else local_position_ids
    if pos.dim() != 2:
        raise ValueError(f"{seq_algo}: position_ids must be (batch, seq), got shape {tuple(pos.shape)}")
    if not algo.distributed:
        return pos
    group = get_sp_group() if group is None else group
    world = dist.get_world_size(group)
    if world == 1:
        return pos
    _agree_on_shape(seq_algo, pos, group)
    send = pos.to(_comm_device(group, pos)).contiguous()
    parts = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(parts, send, group=group)
    seq_local = pos.shape[1]
    full = send.new_empty((pos.shape[0], seq_local * world))
    for rank, part in enumerate(parts):
        for sp in algo.global_rows(rank, world, seq_local, **options):
            full[:, sp.start : sp.start + sp.length] = part[:, sp.local : sp.local + sp.length]
    return full


_CACHE: dict[int, tuple[weakref.ref, int, tuple, Documents | None]] = {}


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


def local_documents(algo, local_position_ids: torch.Tensor, group=None, **options) -> Documents | None:
    """The documents of the full sequence from this rank's local ``position_ids`` shard (collective over the SP
    group: every rank calls it), or None when every row is one document.

    Cached on the tensor object (while it lives and is not modified in place): transformers hands the same
    position_ids to every layer of a forward (and to a checkpointed layer's recompute), so the all-gather runs once
    per forward. Every rank sees the same tensors in the same order, so all ranks hit or miss together.
    """
    return gathered_documents(algo, local_position_ids, group, **options)[1]


def gathered_documents(
    algo, local_position_ids: torch.Tensor, group=None, **options
) -> tuple[str | None, Documents | None]:
    """``(layout error or None, documents)`` of the full sequence put together from every rank's shard (one
    all-gather per position_ids tensor, cached as in :func:`local_documents`, whose entry it shares):
    :func:`~easy_context.core.layout.position_layout_error` says whether the shards fit ``algo``'s layout."""
    from easy_context.core.layout import position_layout_error

    world = 1
    if group is not None or dist.is_initialized():
        from easy_context.core.groups import get_sp_group

        world = dist.get_world_size(get_sp_group() if group is None else group)

    def compute():
        full = gather_position_ids(algo, local_position_ids, group, **options)
        return position_layout_error(algo.name, full), find_documents(full)

    return cached_on(local_position_ids, (algo.name, tuple(sorted(options.items())), id(group), world), compute)


def cached_on(tensor: torch.Tensor, key: tuple, compute):
    """``compute()``, remembered on ``tensor`` (while it lives and is not modified in place) under ``key``: what one
    forward derives from a tensor every layer receives (position_ids, cu_seq_lens) is derived once."""
    ident = id(tensor)
    hit = _CACHE.get(ident)
    if hit is not None and hit[0]() is tensor and hit[1] == _version(tensor) and hit[2] == key:
        return hit[3]
    value = compute()
    _CACHE[ident] = (weakref.ref(tensor, lambda _, i=ident: _CACHE.pop(i, None)), _version(tensor), key, value)
    return value
