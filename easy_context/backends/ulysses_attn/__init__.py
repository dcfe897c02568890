"""Ulysses (all-to-all sequence<->heads) backend."""

from easy_context.backends.ulysses_attn.attention import kv_replication, ulysses_attention, ulysses_wrap
from easy_context.backends.ulysses_attn.prepare_inputs import contiguous_multiple, contiguous_shard, contiguous_spans
from easy_context.core.layout import ulysses_rule
from easy_context.core.seq_algo import SeqAlgo

ALGO = SeqAlgo(
    name="ulysses_attn",
    shard=contiguous_shard,
    multiple=contiguous_multiple,
    impl=ulysses_attention,
    layout_rule=ulysses_rule,
    spans=contiguous_spans,
)

__all__ = ["ALGO", "contiguous_multiple", "contiguous_shard", "kv_replication", "ulysses_attention", "ulysses_wrap"]
