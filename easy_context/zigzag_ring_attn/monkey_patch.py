"""EasyContext's ``easy_context.zigzag_ring_attn.monkey_patch``: Llama and Mistral patches (see
:func:`easy_context._easycontext_monkey_patch` for how a class patch maps onto a model switch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import compat

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_zigzag_ring_attn_monkey_patch_llama(model: PreTrainedModel | None = None) -> PreTrainedModel | None:
    """Llama models built from now on (and ``model``, if given) attend with zigzag ring attention."""
    from .. import _easycontext_monkey_patch  # the package root (imports this module)

    return _easycontext_monkey_patch(
        "zigzag_ring_attn", "llama", model, compat.apply_zigzag_ring_attn_monkey_patch_llama
    )


def apply_zigzag_ring_attn_monkey_patch_mistral(model: PreTrainedModel | None = None) -> PreTrainedModel | None:
    """Mistral models built from now on (and ``model``, if given) attend with zigzag ring attention."""
    from .. import _easycontext_monkey_patch  # the package root (imports this module)

    return _easycontext_monkey_patch(
        "zigzag_ring_attn", "mistral", model, compat.apply_zigzag_ring_attn_monkey_patch_mistral
    )


__all__ = ["apply_zigzag_ring_attn_monkey_patch_llama", "apply_zigzag_ring_attn_monkey_patch_mistral"]
