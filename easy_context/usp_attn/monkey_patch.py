"""EasyContext's ``easy_context.usp.monkey_patch`` (also importable under that name; see
:func:`easy_context._easycontext_monkey_patch` for how a class patch maps onto a model switch)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from .. import compat

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_usp_attn_monkey_patch_llama(
    ring_degree: int | None = None, model: PreTrainedModel | None = None
) -> PreTrainedModel | None:
    """Llama models built from now on (and ``model``, if given) attend with USP over ``ring_degree`` ring ranks
    (None: the backend's default for the SP size); shard with the same degree in ``prepare_usp_attn_inputs``."""
    from .. import _easycontext_monkey_patch  # the package root (imports this module)

    patch_type = partial(compat.apply_usp_attn_monkey_patch_llama, ring_degree)
    return _easycontext_monkey_patch("usp_attn", "llama", model, patch_type, ring_degree=ring_degree)


__all__ = ["apply_usp_attn_monkey_patch_llama"]
