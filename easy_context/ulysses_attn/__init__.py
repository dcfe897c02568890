"""Ulysses (all-to-all sequence<->heads) backend."""

from ..core.layout import ulysses_rule
from ..core.seq_algo import SeqAlgo
from .attention import kv_replication, ulysses_attention, ulysses_wrap
from .prepare_inputs import contiguous_multiple, contiguous_shard, contiguous_spans

ALGO = SeqAlgo(
    name="ulysses_attn",
    shard=contiguous_shard,
    multiple=contiguous_multiple,
    impl=ulysses_attention,
    layout_rule=ulysses_rule,
    spans=contiguous_spans,
)

__all__ = ["ALGO", "contiguous_multiple", "contiguous_shard", "kv_replication", "ulysses_attention", "ulysses_wrap"]
