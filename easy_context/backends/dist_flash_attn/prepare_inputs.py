"""DistFlashAttn sharding: contiguous chunks, rank r holds chunk r of ``world_size`` (as Ulysses).

The full length must be a multiple of ``world_size`` (pad with ``easy_context.pad_to_multiple``), so every
rank holds the same number of rows; any local length works (odd, not a power of two).
"""

from __future__ import annotations

import torch

from easy_context.backends.ulysses_attn.prepare_inputs import contiguous_multiple, contiguous_shard, contiguous_spans


def contiguous_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`contiguous_shard` given every rank's shard in rank order."""
    return torch.cat(shards, dim=dim)


__all__ = ["contiguous_multiple", "contiguous_shard", "contiguous_spans", "contiguous_unshard"]
