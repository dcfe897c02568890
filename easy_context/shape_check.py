"""Agreement of local shard shapes across the SP group, checked before any SP communication.

Ring and all-to-all exchanges assume every rank holds a shard of the same shape and dtype; a mismatch
(an unpadded batch, a rank that sharded differently) would otherwise surface as a hang or corrupted
data. Every call does one tiny all-gather (on every rank, so the check itself can never hang); set
``EASY_CONTEXT_SHAPE_CHECK=0`` to skip it once a setup is known to be right (it costs one host sync per
attention call on GPUs).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


def shape_check_enabled() -> bool:
    return os.environ.get("EASY_CONTEXT_SHAPE_CHECK", "1") != "0"


def check_local_shapes(algo: str, q: torch.Tensor, k: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Raise the same clear ValueError on every rank unless all hold equally shaped q/k shards."""
    if q.shape[1] != k.shape[1]:  # local, so raised on every rank that has the problem before any collective
        raise ValueError(
            f"{algo}: q has {q.shape[1]} local rows but k/v have {k.shape[1]}; sequence-parallel attention is "
            "self-attention over one sharded sequence: shard q, k and v the same way"
        )
    world = dist.get_world_size(group)
    if world == 1 or not shape_check_enabled():
        return
    device = torch.device("cpu") if dist.get_backend(group) == "gloo" else q.device
    mine = torch.tensor([*q.shape, *k.shape, _DTYPE_CODES.get(q.dtype, 9)], dtype=torch.int64, device=device)
    every = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(every, mine, group=group)
    shapes = [tuple(row) for row in every.view(world, -1).tolist()]
    if len(set(shapes)) != 1:
        raise ValueError(
            f"{algo}: every rank must hold a shard of the same shape and dtype; got local "
            f"(q shape, k shape, dtype code) {[(s[:4], s[4:8], s[8]) for s in shapes]} (local lengths "
            f"{[s[1] for s in shapes]}). Pad the full sequence with easy_context.pad_to_multiple(x, "
            f"easy_context.seq_multiple('{algo}', world_size)) and shard it with easy_context.extract_local"
        )
