"""Ulysses sharding: contiguous sequence chunks, rank r holds chunk r."""

from __future__ import annotations

import torch

from easy_context.core.spans import Span


def contiguous_multiple(world_size: int) -> int:
    return world_size


def contiguous_shard(value: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """(…, seq, …) -> (…, seq / world_size, …): chunk ``rank`` of ``world_size`` along ``dim``."""
    return value.chunk(world_size, dim=dim)[rank]


def contiguous_spans(rank: int, world_size: int, seq_local: int) -> tuple[Span, ...]:
    """Rank ``rank``'s local rows are global rows ``rank * seq_local ..``."""
    return (Span(0, rank * seq_local, seq_local),)
