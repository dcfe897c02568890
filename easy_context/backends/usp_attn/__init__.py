"""USP backend: Ulysses (inside) x zigzag ring (across); option ``ring_degree``."""

from easy_context.backends.usp_attn.attention import usp_attention
from easy_context.backends.usp_attn.prepare_inputs import (
    default_ring_degree,
    resolve_ring_degree,
    usp_multiple,
    usp_rule,
    usp_shard,
    usp_spans,
)
from easy_context.backends.zigzag_ring_attn.schedule import zigzag_tasks
from easy_context.core.groups import check_ring_degree
from easy_context.core.ring_schedule import RingSchedule
from easy_context.core.seq_algo import OptionFlag, SeqAlgo


def usp_ring_size(world_size: int, ring_degree: int | None = None) -> int | None:
    """The lockstep ring is the ring degree R: after the Ulysses all-to-all ring rank j holds zigzag shard j of the
    full sequence and the U ranks of a ring index compute the same blocks on other heads (None when R is 1)."""
    ring = resolve_ring_degree(world_size, ring_degree)
    check_ring_degree(world_size, ring)
    return ring if ring > 1 else None


USP_RING = RingSchedule(ring_size=usp_ring_size, tasks=zigzag_tasks)  # its ring is zigzag's


def ring_degrees(world_size: int) -> list[int]:
    """Every ring degree ``world_size`` ranks allow (the divisors), smallest first."""
    return [r for r in range(1, world_size + 1) if world_size % r == 0]


def usp_layout_rule(world_size: int, heads: int, kv_heads: int, ring_degree: int | None = None) -> dict:
    """:func:`usp_rule`; the zigzag ring runs blockwise (also with ring_degree 1)."""
    return {**usp_rule(world_size, heads, kv_heads, ring_degree), "blockwise": True}


ALGO = SeqAlgo(
    name="usp_attn",
    shard=usp_shard,
    multiple=usp_multiple,
    impl=usp_attention,
    options={"ring_degree": None},
    layout_rule=usp_layout_rule,
    spans=usp_spans,
    ring_schedule=USP_RING,
    flags={"ring_degree": OptionFlag("ring size", int, ring_degrees)},
)

__all__ = ["ALGO", "default_ring_degree", "ring_degrees", "usp_attention", "usp_multiple", "usp_shard", "usp_spans"]
