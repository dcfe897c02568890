"""USP sharding: zigzag over the ring dimension, contiguous over the Ulysses dimension.

SP rank i has ring index j = i // U and Ulysses index u = i % U (U = world_size // ring_degree). The ring
shard of j (zigzag chunks j and 2R-1-j) is split into U contiguous pieces; rank i holds piece u. After the
Ulysses all-to-all, the U ranks of ring index j together hold exactly zigzag shard j.
"""

from __future__ import annotations

import math

import torch

from easy_context.backends.ulysses_attn.prepare_inputs import contiguous_shard
from easy_context.backends.zigzag_ring_attn.prepare_inputs import zigzag_shard, zigzag_spans
from easy_context.core.groups import check_ring_degree, usp_layout
from easy_context.core.layout import ulysses_heads
from easy_context.core.spans import Span, restrict


def default_ring_degree(world_size: int) -> int:
    """2 when the SP size is even (Ulysses over the rest), else a pure ring."""
    return 2 if world_size % 2 == 0 else world_size


def resolve_ring_degree(world_size: int, ring_degree: int | None) -> int:
    """The ring degree given, or the default for ``world_size`` (:func:`default_ring_degree`) when None."""
    return default_ring_degree(world_size) if ring_degree is None else ring_degree


def usp_rule(world_size: int, heads: int, kv_heads: int, ring_degree: int | None = None) -> dict:
    """USP's layout: a zigzag ring of ``ring_degree`` (default :func:`default_ring_degree`) x Ulysses over the rest."""
    ring = resolve_ring_degree(world_size, ring_degree)
    check_ring_degree(world_size, ring)
    rep, why = ulysses_heads(heads, kv_heads, world_size // ring)
    return {"ring": ring, "ulysses": world_size // ring, "kv_rep": rep, "options": {"ring_degree": ring},
            "infeasible": why}  # fmt: skip


def usp_multiple(world_size: int, ring_degree: int | None = None) -> int:
    ring_degree = resolve_ring_degree(world_size, ring_degree)
    check_ring_degree(world_size, ring_degree)
    # 2R zigzag chunks (ring shards of even length), each ring shard split into U equal pieces
    return ring_degree * math.lcm(2, world_size // ring_degree)


def usp_shard(value: torch.Tensor, rank: int, world_size: int, dim: int = 1, ring_degree: int | None = None):
    ring_degree = resolve_ring_degree(world_size, ring_degree)
    ring_idx, uly_idx = usp_layout(rank, world_size, ring_degree)
    ring_piece = zigzag_shard(value, ring_idx, ring_degree, dim)
    return contiguous_shard(ring_piece, uly_idx, world_size // ring_degree, dim)


def usp_spans(rank: int, world_size: int, seq_local: int, ring_degree: int | None = None) -> tuple[Span, ...]:
    """Global rows of SP rank ``rank``'s local rows: piece u (of U) of the zigzag ring shard of its ring index."""
    ring_degree = resolve_ring_degree(world_size, ring_degree)
    ring_idx, uly_idx = usp_layout(rank, world_size, ring_degree)
    uly = world_size // ring_degree
    ring_shard = zigzag_spans(ring_idx, ring_degree, seq_local * uly)
    return restrict(ring_shard, uly_idx * seq_local, seq_local)
