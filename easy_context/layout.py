"""The answer to every layout question: how one backend spreads a sequence and its heads over W ranks.

Each backend's :class:`~easy_context.seq_algo.SeqAlgo` owns a layout rule; ``get_seq_algo(name).layout(world_size,
heads, kv_heads, **options)`` returns a :class:`Layout`. train.py, the evals and the planner ask it instead of
re-deriving a backend's constraints from its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Layout:
    """A backend on ``world_size`` ranks: each holds ``S / shard`` of a length-``S`` sequence (``S % multiple == 0``).

    ``ring``: ranks a K/V shard travels over (1: none); ``ulysses``: the all-to-all (head-scatter) degree (1: none);
    ``kv_rep``: how often each K/V head is repeated before the all-to-all; ``options``: the backend's options with
    defaults resolved (``ring_degree`` of usp_attn); ``infeasible``: why it cannot run and what to use instead,
    prefixed with the backend's name (None: it can run).
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

    def require(self) -> Layout:
        """This layout, or ``ValueError`` naming why it cannot run and what to use instead."""
        if self.infeasible:
            raise ValueError(f"{self.infeasible} ({self.world_size} ranks)")
        return self

    def check_length(self, length: int, what: str = "the sequence length") -> None:
        """``ValueError`` naming the fix when ``length`` does not shard evenly."""
        if length % self.multiple:
            given = "".join(f", {k}={v!r}" for k, v in self.options.items())
            raise ValueError(
                f"{what} {length} must be a multiple of {self.multiple} for {self.seq_algo} on {self.world_size} "
                f"ranks; pad it (easy_context.pad_seq_parallel_inputs, or pad_to_multiple(x, "
                f"seq_multiple('{self.seq_algo}', {self.world_size}{given}))) or choose a length that divides"
            )


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
    return {"ring": world_size}


def ulysses_rule(world_size: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """Ulysses: heads scattered over all ranks."""
    rep, why = ulysses_heads(heads, kv_heads, world_size)
    return {"ulysses": world_size, "kv_rep": rep, "infeasible": why}


def local_rule(world_size: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """Data parallel: every rank holds whole sequences."""
    return {"shard": 1}
