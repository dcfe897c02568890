"""Extending a model's context: the rules a recipe is derived from (``easy-context-extend``, docs/extension.md).

:mod:`.rope_base`: the smallest RoPE base that keeps the long-term-decay property up to a target length.
"""

from easy_context.extend.rope_base import decay_sum, min_rope_base, satisfies_bound

__all__ = ["decay_sum", "min_rope_base", "satisfies_bound"]
