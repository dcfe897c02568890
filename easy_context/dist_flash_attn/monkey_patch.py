"""EasyContext's ``easy_context.dist_flash_attn.monkey_patch`` (see :func:`easy_context._easycontext_monkey_patch`
for how a class patch maps onto a model switch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import compat

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_dist_flash_attn_monkey_patch_llama(model: PreTrainedModel | None = None) -> PreTrainedModel | None:
    """Llama models built from now on (and ``model``, if given) attend with DistFlashAttn (no process-group setup
    is needed first, unlike EasyContext's)."""
    from .. import _easycontext_monkey_patch  # the package root (imports this module)

    return _easycontext_monkey_patch("dist_flash_attn", "llama", model, compat.apply_dist_flash_attn_monkey_patch_llama)


__all__ = ["apply_dist_flash_attn_monkey_patch_llama"]
