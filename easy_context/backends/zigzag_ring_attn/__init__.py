"""Zigzag ring attention backend (load-balanced causal ring, Brandon et al. / ring-flash-attn style)."""

from easy_context.backends.zigzag_ring_attn.attention import ring_backward, ring_forward, zigzag_ring_attention
from easy_context.backends.zigzag_ring_attn.prepare_inputs import (
    zigzag_multiple,
    zigzag_shard,
    zigzag_spans,
    zigzag_unshard,
)
from easy_context.backends.zigzag_ring_attn.schedule import ZIGZAG_RING, zigzag_blocks, zigzag_tasks
from easy_context.core.seq_algo import SeqAlgo

ALGO = SeqAlgo(
    name="zigzag_ring_attn",
    shard=zigzag_shard,
    multiple=zigzag_multiple,
    impl=zigzag_ring_attention,
    spans=zigzag_spans,
    ring_schedule=ZIGZAG_RING,
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
    "zigzag_tasks",
    "zigzag_unshard",
]
