"""What a backend tells the document balancer about its ring: how many ranks run in lockstep, and which blocks
each computes at each step.

A backend whose ring steps run in lockstep (a step lasts as long as its busiest rank) sets
``SeqAlgo.ring_schedule``; :mod:`easy_context.core.document_order` reads it and never names a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from easy_context.core.block import Block
from easy_context.core.spans import Span

# (blocks, query spans, key spans) of one task: the blocks index the runner's local query / key tensors, whose rows
# sit at the spans' global rows (the arguments of :func:`easy_context.core.documents.split_blocks`)
Task = tuple[list[Block], tuple[Span, ...], tuple[Span, ...]]
Tasks = list[list[list[Task]]]  # tasks[step][rank]


@dataclass(frozen=True)
class RingSchedule:
    """``ring_size(world_size, **options)``: the ranks of the lockstep ring on ``world_size`` SP ranks, or None when
    no document order changes the per-rank work; ``tasks(world, seq_length, causal)``: ``tasks[step][rank]`` on a
    ring of ``world`` ranks over ``seq_length`` global rows (the forward's; the backward computes the same blocks).
    Two backends that run the same ring (USP's is zigzag's) share ``tasks``, and with it the cached cost model."""

    ring_size: Callable[..., int | None]
    tasks: Callable[[int, int, bool], Tasks]


def whole_world(world_size: int, **options) -> int | None:
    """The ring is all ``world_size`` SP ranks (zigzag, DistFlashAttn); one rank has nothing to balance."""
    return world_size if world_size > 1 else None
