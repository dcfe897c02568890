"""EasyContext's module path ``easy_context.dist_flash_attn.prepare_input`` (singular, as EasyContext named it)."""

from ..compat import prepare_dist_flash_attn_inputs

__all__ = ["prepare_dist_flash_attn_inputs"]
