"""EasyContext's ``easy_context.ulysses_attn.monkey_patch`` (see :func:`easy_context._easycontext_monkey_patch`
for how a class patch maps onto a model switch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import compat

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_ulysses_attn_monkey_patch_llama(model: PreTrainedModel | None = None) -> PreTrainedModel | None:
    """Llama models built from now on (and ``model``, if given) attend with Ulysses (no yunchang needed)."""
    from .. import _easycontext_monkey_patch  # the package root (imports this module)

    return _easycontext_monkey_patch("ulysses_attn", "llama", model, compat.apply_ulysses_attn_monkey_patch_llama)


__all__ = ["apply_ulysses_attn_monkey_patch_llama"]
