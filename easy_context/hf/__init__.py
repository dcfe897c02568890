"""transformers integration: SP attention through ``AttentionInterface``."""

from .attention import check_supported, make_hf_attention
from .patch import apply_seq_parallel_monkey_patch, attention_name

__all__ = ["apply_seq_parallel_monkey_patch", "attention_name", "check_supported", "make_hf_attention"]
