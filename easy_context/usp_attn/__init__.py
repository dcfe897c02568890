"""USP backend: Ulysses (inside) x zigzag ring (across); option ``ring_degree``."""

from ..core.seq_algo import OptionFlag, SeqAlgo
from .attention import usp_attention
from .prepare_inputs import default_ring_degree, usp_multiple, usp_rule, usp_shard, usp_spans


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
    flags={"ring_degree": OptionFlag("ring size", int, ring_degrees)},
)

__all__ = ["ALGO", "default_ring_degree", "ring_degrees", "usp_attention", "usp_multiple", "usp_shard", "usp_spans"]
