"""Exchange buffers with peers at fixed ring offsets, all in one ``batch_isend_irecv``.

``start_exchange(sends, group)`` with ``sends = {s: tensor}``: for every offset ``s`` (taken mod W, in 1..W-1) this
rank sends ``sends[s]`` to group rank ``(rank + s) % W`` and receives a buffer of the same shape and dtype from
``(rank - s) % W``; ``wait()`` returns ``{s: received}``. Every rank must pass the same offsets (each send then has its
receive on the peer); distinct offsets reach distinct peers, so no two messages of one batch share a (sender,
receiver) pair. The ring (:class:`~easy_context.comm.ring.RingExchange`) is the special case ``{1: x}``; the way back
to the ``(rank - s)`` peer is offset ``W - s``::

    pending = start_exchange({s: kv for s in (1, 3)}, group)  # kv to rank + 1 and rank + 3
    ... compute with the local kv ...
    got = pending.wait()                                      # got[1]: rank - 1's kv, got[3]: rank - 3's
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from easy_context.comm.ring import PendingExchange


def start_exchange(sends: Mapping[int, torch.Tensor], group: dist.ProcessGroup | None) -> PendingExchange:
    """Send ``sends[s]`` to rank ``(rank + s) % W`` and receive from ``(rank - s) % W`` for every offset ``s``, in one
    batched P2P call; ``wait()`` gives ``{s: tensor}`` (the offsets as passed). Offsets must be distinct mod W and
    none 0 mod W (a rank does not message itself)."""
    group = dist.group.WORLD if group is None else group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    residues = [s % world for s in sends]
    if 0 in residues or len(set(residues)) != len(residues):
        raise ValueError(f"exchange offsets {sorted(sends)} must be distinct and nonzero mod the group size {world}")
    if not sends:
        return PendingExchange([], {})
    ops, received, sent = [], {}, []
    for s, tensor in sends.items():
        send = tensor.contiguous()
        recv = received[s] = torch.empty_like(send)
        sent.append(send)
        ops.append(dist.P2POp(dist.isend, send, dist.get_global_rank(group, (rank + s) % world), group))
        ops.append(dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, (rank - s) % world), group))
    return PendingExchange(dist.batch_isend_irecv(ops), received, sent)


def exchange(sends: Mapping[int, torch.Tensor], group: dist.ProcessGroup | None) -> dict[int, torch.Tensor]:
    """Blocking :func:`start_exchange`: ``{s: the buffer received from rank (rank - s) % W}``."""
    return start_exchange(sends, group).wait()
