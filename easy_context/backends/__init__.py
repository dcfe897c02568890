"""The built-in sequence-parallel backends, registered once, in the order every listing shows them (command-line
help, ``easy_context.SEQ_ALGOS``, the planner's tie-break). ``import easy_context`` imports this module first; the
registry itself (:mod:`easy_context.core.registry`) sits below the backends and imports none of them."""

from __future__ import annotations

from easy_context.backends import data_parallel, dist_flash_attn, ulysses_attn, usp_attn, zigzag_ring_attn
from easy_context.core.registry import register_seq_algo

BUILTIN = (zigzag_ring_attn, dist_flash_attn, ulysses_attn, usp_attn, data_parallel)

for _backend in BUILTIN:
    register_seq_algo(_backend.ALGO)
