"""EasyContext's ``easy_context.dist_flash_attn.monkey_patch`` (the patches live in :mod:`easy_context.compat`)."""

from ..compat import apply_dist_flash_attn_monkey_patch_llama

__all__ = ["apply_dist_flash_attn_monkey_patch_llama"]
