"""DistFlashAttn backend (LightSeq, Li et al. 2023): contiguous shards, helper ranks balance causal work."""

from easy_context.backends.dist_flash_attn.attention import dist_backward, dist_flash_attention, dist_forward
from easy_context.backends.dist_flash_attn.prepare_inputs import (
    contiguous_multiple,
    contiguous_shard,
    contiguous_spans,
    contiguous_unshard,
)
from easy_context.backends.dist_flash_attn.schedule import (
    DIST_FLASH_RING,
    Task,
    build_schedule,
    rank_kernel_calls,
    rank_work,
)
from easy_context.core.layout import ring_rule
from easy_context.core.seq_algo import SeqAlgo


def helper_rule(world_size: int, heads: int, kv_heads: int) -> dict:
    """A ring over all ranks, with helper ranks computing blocks of the busier ranks' queries."""
    return {**ring_rule(world_size, heads, kv_heads), "borrows_queries": world_size > 1}


ALGO = SeqAlgo(
    name="dist_flash_attn",
    shard=contiguous_shard,
    multiple=contiguous_multiple,
    impl=dist_flash_attention,
    layout_rule=helper_rule,
    spans=contiguous_spans,
    ring_schedule=DIST_FLASH_RING,
)

__all__ = [
    "ALGO",
    "Task",
    "build_schedule",
    "contiguous_multiple",
    "contiguous_shard",
    "contiguous_unshard",
    "dist_backward",
    "dist_flash_attention",
    "dist_forward",
    "helper_rule",
    "rank_kernel_calls",
    "rank_work",
]
