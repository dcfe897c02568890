"""Data parallel "backend": every rank holds whole sequences; attention is local."""

from __future__ import annotations

import torch

from ..layout import local_rule
from ..local_attn import local_attention
from ..seq_algo import SeqAlgo


def identity_shard(value: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Data parallel keeps the whole sequence on every rank."""
    return value


ALGO = SeqAlgo(
    name="data_parallel",
    shard=identity_shard,
    multiple=lambda world_size: 1,
    impl=local_attention,
    distributed=False,
    layout_rule=local_rule,
)

__all__ = ["ALGO", "identity_shard"]
