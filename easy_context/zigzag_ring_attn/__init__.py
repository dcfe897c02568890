"""Zigzag ring attention backend (load-balanced causal ring, Brandon et al. / ring-flash-attn style)."""

from ..core.seq_algo import SeqAlgo
from .attention import ring_backward, ring_forward, zigzag_ring_attention
from .prepare_inputs import zigzag_multiple, zigzag_shard, zigzag_spans, zigzag_unshard
from .schedule import zigzag_blocks

ALGO = SeqAlgo(
    name="zigzag_ring_attn",
    shard=zigzag_shard,
    multiple=zigzag_multiple,
    impl=zigzag_ring_attention,
    spans=zigzag_spans,
)

__all__ = [
    "ALGO",
    "ring_backward",
    "ring_forward",
    "zigzag_blocks",
    "zigzag_multiple",
    "zigzag_ring_attention",
    "zigzag_shard",
    "zigzag_spans",
    "zigzag_unshard",
]
