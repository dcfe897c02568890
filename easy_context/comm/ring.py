"""Ring exchange over a process group with ``batch_isend_irecv``, for overlapping with compute.

Each rank sends a buffer to the next rank of the group and receives the previous rank's buffer into a
fresh one (double buffering), so the kernel can keep reading the current buffer while the next arrives:

    ring = RingExchange(group)
    pending = ring.start(kv)      # returns immediately
    ... compute with kv ...
    kv = pending.wait()           # the previous rank's kv
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class PendingExchange:
    """Point-to-point messages in flight (``batch_isend_irecv`` requests); ``wait()`` returns ``received`` (the
    receive buffer, or any structure of them) once all arrived. ``sent`` keeps the send buffers alive until then."""

    def __init__(self, reqs: list, received: Any, sent: Sequence[torch.Tensor] = ()):
        self._reqs, self._received, self._sent = reqs, received, list(sent)

    def wait(self) -> Any:
        for req in self._reqs:
            req.wait()
        self._reqs, self._sent = [], []
        return self._received


class RingExchange:
    """Pass buffers around the ring ``rank -> rank + 1`` of ``group``."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next_rank = dist.get_global_rank(group, (self.rank + 1) % self.world_size)
        self.prev_rank = dist.get_global_rank(group, (self.rank - 1) % self.world_size)

    def start(self, send: torch.Tensor, recv: torch.Tensor | None = None) -> PendingExchange:
        """Send ``send`` to the next rank and receive the previous rank's buffer (same shape and dtype)."""
        send = send.contiguous()
        recv = torch.empty_like(send) if recv is None else recv
        ops = [
            dist.P2POp(dist.isend, send, self.next_rank, self.group),
            dist.P2POp(dist.irecv, recv, self.prev_rank, self.group),
        ]
        return PendingExchange(dist.batch_isend_irecv(ops), recv)
