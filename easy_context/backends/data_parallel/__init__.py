"""Data parallel "backend": every rank holds whole sequences; attention is local."""

from __future__ import annotations

import torch

from easy_context.core.layout import local_rule
from easy_context.core.local_attn import local_attention
from easy_context.core.seq_algo import SeqAlgo
from easy_context.core.spans import Span


def identity_shard(value: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Data parallel keeps the whole sequence on every rank."""
    return value


def identity_spans(rank: int, world_size: int, seq_local: int) -> tuple[Span, ...]:
    """Every rank holds the whole sequence."""
    return (Span(0, 0, seq_local),)


ALGO = SeqAlgo(
    name="data_parallel",
    shard=identity_shard,
    multiple=lambda world_size: 1,
    impl=local_attention,
    distributed=False,
    layout_rule=local_rule,
    spans=identity_spans,
)

__all__ = ["ALGO", "identity_shard", "identity_spans"]
