"""EasyContext's ``easy_context.usp.monkey_patch`` (the patches live in :mod:`easy_context.compat`)."""

from ..compat import apply_usp_attn_monkey_patch_llama

__all__ = ["apply_usp_attn_monkey_patch_llama"]
