"""DistFlashAttn on W virtual ranks in one process: the same rank programs and rounds, no communication.

Messages are delivered by handing the sender's tensors to the receiver, in the order of the distributed
driver (sends taken before a step computes, deliveries after it), so results match the distributed run.
Used by tests and by the single-GPU schedule benchmark (``bench/attention.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from easy_context.backends.dist_flash_attn.attention import BackwardRank, ForwardRank
from easy_context.backends.dist_flash_attn.schedule import build_schedule, comm_rounds
from easy_context.core.documents import Documents
from easy_context.kernels import AttnKernel


@dataclass
class VirtualStats:
    """Per-rank counts of one virtual run: local kernel calls and tensors received (messages)."""

    kernel_calls: list[int] = field(default_factory=list)
    messages_in: list[int] = field(default_factory=list)


def _counting(kernel: AttnKernel, calls: list[int], rank: int) -> AttnKernel:
    def fwd(*args, **kw):
        calls[rank] += 1
        return kernel.forward_impl(*args, **kw)

    def bwd(*args, **kw):
        calls[rank] += 1
        return kernel.backward_impl(*args, **kw)

    return replace(kernel, forward_impl=fwd, backward_impl=bwd)  # keeps its variants (supports, softcap)


def _drive_virtual(progs: list, causal: bool, backward: bool, stats: VirtualStats | None) -> None:
    world = len(progs)
    steps = build_schedule(world, causal)
    for i, msgs in enumerate(comm_rounds(world, causal, backward)):
        in_flight = [(msg, progs[msg.src].payload(msg)) for msg in msgs]
        if 1 <= i <= len(steps):
            for task in steps[i - 1]:
                progs[task.runner].run(task)
        for msg, tensors in in_flight:
            progs[msg.dst].receive(msg, tensors)
            if stats is not None:
                stats.messages_in[msg.dst] += 1


def _kernels(kernel: AttnKernel, world: int, stats: VirtualStats | None) -> list[AttnKernel]:
    if stats is None:
        return [kernel] * world
    stats.kernel_calls, stats.messages_in = [0] * world, [0] * world
    return [_counting(kernel, stats.kernel_calls, r) for r in range(world)]


def virtual_forward(
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    kernel: AttnKernel,
    scale: float,
    causal: bool,
    stats: VirtualStats | None = None,
    documents: Documents | None = None,
    window: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-rank contiguous shards q (b, s, h, d), k/v (b, s, h_kv, d) -> per-rank out (b, s, h, d), lse (b, h, s).

    ``stats`` (optional) is filled with per-rank kernel calls and received messages; ``documents``: document
    masking of the full sequence; ``window``: causal sliding window (a task beyond it makes no kernel call).
    """
    kerns = _kernels(kernel, len(qs), stats)
    progs = [ForwardRank(q, k, v, kern, scale, causal, documents, window)
             for q, k, v, kern in zip(qs, ks, vs, kerns, strict=True)]  # fmt: skip
    _drive_virtual(progs, causal, backward=False, stats=stats)
    results = [p.result() for p in progs]
    return [r[0] for r in results], [r[1] for r in results]


def virtual_backward(
    douts: list[torch.Tensor],
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    outs: list[torch.Tensor],
    lses: list[torch.Tensor],
    kernel: AttnKernel,
    scale: float,
    causal: bool,
    stats: VirtualStats | None = None,
    documents: Documents | None = None,
    window: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per-rank (dq, dk, dv) of :func:`virtual_forward` given its outs and lses."""
    kerns = _kernels(kernel, len(qs), stats)
    progs = [
        BackwardRank(d, q, k, v, o, lse, kern, scale, causal, documents, window)
        for d, q, k, v, o, lse, kern in zip(douts, qs, ks, vs, outs, lses, kerns, strict=True)
    ]
    _drive_virtual(progs, causal, backward=True, stats=stats)
    results = [p.result() for p in progs]
    return [r[0] for r in results], [r[1] for r in results], [r[2] for r in results]
