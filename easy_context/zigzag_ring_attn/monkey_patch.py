"""EasyContext's ``easy_context.zigzag_ring_attn.monkey_patch`` (the patches live in :mod:`easy_context.compat`)."""

from ..compat import apply_zigzag_ring_attn_monkey_patch_llama, apply_zigzag_ring_attn_monkey_patch_mistral

__all__ = ["apply_zigzag_ring_attn_monkey_patch_llama", "apply_zigzag_ring_attn_monkey_patch_mistral"]
