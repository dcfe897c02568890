"""Sequence <-> heads all-to-all (Ulysses), as an autograd function.

``all_to_all_4d(x, scatter_dim=2, gather_dim=1)`` turns a sequence shard (b, s/W, h, d) into a head shard
(b, s, h/W, d) of the full sequence; ``scatter_dim=1, gather_dim=2`` is the inverse. The backward of one
is the other.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_to_all_4d(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Split ``x`` into W pieces along ``scatter_dim``, send piece i to rank i, concat received along ``gather_dim``.

    Only (scatter, gather) = (2, 1) [seq shard -> head shard] and (1, 2) [head shard -> seq shard] are used.
    """
    world = dist.get_world_size(group)
    if world == 1:
        return x
    if x.shape[scatter_dim] % world != 0:
        raise ValueError(f"dim {scatter_dim} of size {x.shape[scatter_dim]} is not divisible by the group size {world}")
    b, s, h, d = x.shape
    if (scatter_dim, gather_dim) == (2, 1):
        # (b, s_l, W, h/W, d) -> (W, b, s_l, h/W, d): piece i = head group i
        send = x.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        # recv[i] = sequence chunk i of my head group -> (b, W * s_l, h/W, d)
        return recv.permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)
    if (scatter_dim, gather_dim) == (1, 2):
        # (b, W, s/W, h_l, d) -> (W, b, s/W, h_l, d): piece i = sequence chunk i
        send = x.reshape(b, world, s // world, h, d).permute(1, 0, 2, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        # recv[i] = head group i of my sequence chunk -> (b, s/W, W * h_l, d)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, s // world, world * h, d)
    raise ValueError(f"unsupported all-to-all dims scatter={scatter_dim} gather={gather_dim}")


class SeqAllToAll(torch.autograd.Function):
    """Differentiable :func:`all_to_all_4d`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all_4d(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all_4d(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None
