"""Zigzag sharding: split the sequence into 2W chunks; rank r holds chunks r and 2W-1-r.

Pairing an early chunk with a late one gives every rank the same amount of causal work.
"""

from __future__ import annotations

import torch

from easy_context.core.spans import Span


def zigzag_multiple(world_size: int) -> int:
    return 2 * world_size


def zigzag_shard(value: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """(…, seq, …) -> (…, seq / world_size, …): chunks ``rank`` and ``2*world_size-1-rank`` along ``dim``."""
    chunks = value.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_spans(rank: int, world_size: int, seq_local: int) -> tuple[Span, ...]:
    """Global rows of rank ``rank``'s ``seq_local`` local rows: chunks ``rank`` and ``2W-1-rank`` of ``seq_local/2``."""
    half = seq_local // 2
    if 2 * half != seq_local:  # never for zigzag shards: the full length is a multiple of 2W
        raise ValueError(f"zigzag_ring_attn: local length {seq_local} is odd")
    return (Span(0, rank * half, half), Span(half, (2 * world_size - 1 - rank) * half, half))


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`zigzag_shard` given every rank's shard in rank order."""
    world = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    ordered = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return torch.cat(ordered, dim=dim)
