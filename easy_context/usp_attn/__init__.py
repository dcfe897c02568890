"""USP backend: Ulysses (inside) x zigzag ring (across); option ``ring_degree``."""

from ..seq_algo import SeqAlgo
from .attention import usp_attention
from .prepare_inputs import default_ring_degree, usp_multiple, usp_rule, usp_shard, usp_spans

ALGO = SeqAlgo(
    name="usp_attn",
    shard=usp_shard,
    multiple=usp_multiple,
    impl=usp_attention,
    options={"ring_degree": None},
    layout_rule=usp_rule,
    spans=usp_spans,
)

__all__ = ["ALGO", "default_ring_degree", "usp_attention", "usp_multiple", "usp_shard", "usp_spans"]
