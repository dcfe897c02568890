"""The answer to every layout question: how one backend spreads a sequence and its heads over W ranks.

Each backend's :class:`~easy_context.core.seq_algo.SeqAlgo` owns a layout rule; ``get_seq_algo(name).layout(world_size,
heads, kv_heads, **options)`` returns a :class:`Layout`. train.py, the evals, the planner and the benches ask it
instead of re-deriving a backend's constraints from its name. The messages for a length that does not shard
(:func:`length_error`) and the ``seq_multiple`` call that fixes it (:func:`seq_multiple_call`) live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def seq_multiple_call(seq_algo: str, world_size: int | str, options: Mapping[str, Any] | None = None) -> str:
    """The ``easy_context.seq_multiple(...)`` call that names the length multiple (for error messages)."""
    given = "".join(f", {k}={v!r}" for k, v in (options or {}).items() if v is not None)
    return f"easy_context.seq_multiple('{seq_algo}', {world_size}{given})"


def length_error(seq_algo: str, length: int, multiple: int, world_size: int,
                 options: Mapping[str, Any] | None = None, what: str = "sequence length") -> str | None:  # fmt: skip
    """Why a full sequence of ``length`` cannot be sharded evenly, and how to pad it; None when it can."""
    if length <= 0:  # every rank's shard would be empty (the CPU kernel dies of SIGFPE on one)
        return (f"{seq_algo}: {what} {length}: every rank would hold an empty shard; a sequence over {world_size} "
                f"ranks needs at least {multiple} tokens (a multiple of {multiple}: "
                f"{seq_multiple_call(seq_algo, world_size, options)})")  # fmt: skip
    if length % multiple == 0:
        return None
    given = ", ".join(f"{k}={v!r}" for k, v in (options or {}).items() if v is not None)
    return (
        f"{seq_algo}: {what} {length} is not divisible by {multiple} (it must be a multiple of {multiple} on "
        f"{world_size} ranks{' with ' + given if given else ''}); pad it first with "
        "easy_context.pad_seq_parallel_inputs(...) (ids, position ids, targets) or easy_context.pad_to_multiple(x, "
        f"{seq_multiple_call(seq_algo, world_size, options)}, dim=...) -- input ids with the pad token, targets "
        "with -100 -- or choose a length that divides"
    )


def heads_of(config: Any) -> tuple[int, int]:
    """(query heads, K/V heads) of a transformers model config (K/V heads default to the query heads)."""
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


@dataclass(frozen=True)
class Layout:
    """A backend on ``world_size`` ranks: each holds ``S / shard`` of a length-``S`` sequence (``S % multiple == 0``).

    ``ring``: ranks a K/V shard travels over (1: none); ``ulysses``: the all-to-all (head-scatter) degree (1: none);
    ``kv_rep``: how often each K/V head is repeated before the all-to-all; ``options``: the backend's options with
    defaults resolved (``ring_degree`` of usp_attn); ``infeasible``: why it cannot run and what to use instead,
    prefixed with the backend's name (None: it can run). What the planner counts: ``blockwise``, attention runs
    block by block with merged partial results (a stacked K/V copy, fp32 out + LSE accumulators; ring backends, also
    on one rank); ``borrows_queries``, idle ranks compute blocks of busier ranks' queries (DistFlashAttn's helpers).
    """

    seq_algo: str
    world_size: int
    multiple: int
    shard: int
    ring: int = 1
    ulysses: int = 1
    kv_rep: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    infeasible: str | None = None
    blockwise: bool = False
    borrows_queries: bool = False

    def require(self) -> Layout:
        """This layout, or ``ValueError`` naming why it cannot run and what to use instead."""
        if self.infeasible:
            raise ValueError(f"{self.infeasible} ({self.world_size} ranks)")
        return self

    def check_length(self, length: int, what: str = "sequence length") -> Layout:
        """This layout, or ``ValueError`` naming the fix when ``length`` does not shard evenly."""
        error = length_error(self.seq_algo, length, self.multiple, self.world_size, self.options, what)
        if error:
            raise ValueError(error)
        return self


def ulysses_heads(heads: int, kv_heads: int, degree: int) -> tuple[int, str | None]:
    """(K/V replication, None) when ``heads`` query and ``kv_heads`` K/V heads split over ``degree`` ranks,
    else (1, the reason and the fix)."""
    if degree == 1 or (heads % degree == 0 and kv_heads % degree == 0):
        return 1, None
    if heads % degree:
        return 1, (
            f"{heads} query heads are not divisible by the Ulysses degree {degree}; use usp_attn with a ring_degree "
            "such that the heads divide by world_size // ring_degree, or zigzag_ring_attn (no head constraint)"
        )
    if degree % kv_heads == 0:
        return degree // kv_heads, None
    return 1, (
        f"{kv_heads} key/value heads cannot be split over the Ulysses degree {degree} (neither divides the other); "
        "use usp_attn with a larger ring_degree, or zigzag_ring_attn"
    )


def ring_rule(world_size: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """Ring backends (zigzag, DistFlashAttn): K/V shards travel over all ranks, no head constraint."""
    return {"ring": world_size, "blockwise": True}


def ulysses_rule(world_size: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """Ulysses: heads scattered over all ranks."""
    rep, why = ulysses_heads(heads, kv_heads, world_size)
    return {"ulysses": world_size, "kv_rep": rep, "infeasible": why}


def local_rule(world_size: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """Data parallel: every rank holds whole sequences."""
    return {"shard": 1}


def position_layout_error(seq_algo: str, full_position_ids: Any) -> str | None:
    """Why the full sequence's (batch, seq) position ids, put together from every rank's shard by ``seq_algo``'s
    layout, cannot be a real batch's; None when they can. Inside a row a position follows the previous one, skips
    forward, or restarts at the row's smallest position (0 from our packer, ``position_ids_start`` from
    DataCollatorWithFlattening): each of those starts a packed document. A jump back to any other position is what
    shards put together in the wrong order make (the whole sequence on every rank, or shards cut by another backend
    or other options), never a real row."""
    pos = full_position_ids
    step = pos[:, 1:] - pos[:, :-1]
    ok = (step >= 1) | (pos[:, 1:] == pos.min(dim=1, keepdim=True).values)
    if bool(ok.all()):
        return None
    row, col = (~ok).nonzero()[0].tolist()
    return (
        f"{seq_algo}: the ranks' position_ids, put together by {seq_algo}'s layout, jump from {int(pos[row, col])} to "
        f"{int(pos[row, col + 1])} at token {col + 1} of the full sequence (row {row}): every rank must pass its own "
        f"shard of the full sequence, cut for {seq_algo} with the same options (prepare_seq_parallel_inputs or "
        f"extract_local('{seq_algo}', ...)), not the whole sequence or another backend's shard (packed documents "
        "restart their positions at the row's smallest one)"
    )
