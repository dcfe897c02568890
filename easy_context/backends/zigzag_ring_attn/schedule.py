"""Which blocks a zigzag rank computes at each ring step.

Rank r holds query chunks (r, 2W-1-r) as halves [0:h] and [h:2h] of its local rows. At ring step t it
holds the K/V of rank src = (r - t) mod W, chunks (src, 2W-1-src):
* src == r: one causal block over all local rows (the two diagonal chunks and the full block between);
* src <  r: all queries attend to the first K/V half (chunk src precedes both query chunks);
* src >  r: the second query half attends to all K/V (chunk 2W-1-r follows both K/V chunks).
Each non-diagonal step is exactly two chunk x chunk blocks, so every rank does equal work each step.
"""

from __future__ import annotations

from easy_context.backends.zigzag_ring_attn.prepare_inputs import zigzag_spans
from easy_context.core.block import Block
from easy_context.core.ring_schedule import RingSchedule, Tasks, whole_world


def zigzag_blocks(rank: int, src: int, seq_local: int, causal: bool) -> list[Block]:
    everything = slice(0, seq_local)
    if not causal:
        return [Block(everything, everything, False)]
    half = seq_local // 2
    if src == rank:
        return [Block(everything, everything, True)]
    if src < rank:
        return [Block(everything, slice(0, half), False)]
    return [Block(slice(half, seq_local), everything, False)]


def zigzag_tasks(world: int, seq_length: int, causal: bool = True) -> Tasks:
    """``tasks[step][rank]`` of the zigzag ring on ``world`` ranks over ``seq_length`` rows: W steps, one task each."""
    s = seq_length // world
    return [
        [
            [(zigzag_blocks(rank, src, s, causal), zigzag_spans(rank, world, s), zigzag_spans(src, world, s))]
            for rank, src in ((rank, (rank - step) % world) for rank in range(world))
        ]
        for step in range(world)
    ]


ZIGZAG_RING = RingSchedule(ring_size=whole_world, tasks=zigzag_tasks)
