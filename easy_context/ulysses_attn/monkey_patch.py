"""EasyContext's ``easy_context.ulysses_attn.monkey_patch`` (the patches live in :mod:`easy_context.compat`)."""

from ..compat import apply_ulysses_attn_monkey_patch_llama

__all__ = ["apply_ulysses_attn_monkey_patch_llama"]
