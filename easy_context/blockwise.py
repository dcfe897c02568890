"""Block-wise attention: the compute of one schedule step, shared by every ring-style backend.

A schedule says, for each step, which (query rows x key rows) blocks a rank computes against the K/V it
holds. The forward merges each block into fp32 accumulators; the backward feeds the *final* output and
LSE of those rows to the kernel's backward, which makes the per-block gradients exact, and accumulates
them in fp32. Communication lives elsewhere (``comm``), so the same functions also drive single-process
"virtual rank" simulations in tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import AttnKernel
from .lse_merge import merge_into_


@dataclass(frozen=True)
class Block:
    """Query rows ``q_rows`` attend to key rows ``k_rows`` (local indices); ``causal`` only when square."""

    q_rows: slice
    k_rows: slice
    causal: bool


class ForwardAccumulator:
    """fp32 running (out, lse) of the local queries: out (b, s_q, h, d), lse (b, h, s_q)."""

    def __init__(self, q: torch.Tensor):
        self.out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        self.lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device)
        self.covered = torch.zeros(q.shape[1], dtype=torch.bool)  # rows written at least once

    def add(self, rows: slice, out: torch.Tensor, lse: torch.Tensor) -> None:
        fresh = not bool(self.covered[rows].any())
        if fresh:  # first contribution to these rows: copy, no exp(-inf - -inf)
            self.out[:, rows].copy_(out)
            self.lse[:, :, rows].copy_(lse)
            self.covered[rows] = True
        else:
            if not bool(self.covered[rows].all()):
                raise AssertionError("schedule must cover block rows uniformly")
            merge_into_(self.out[:, rows], self.lse[:, :, rows], out, lse)

    def result(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if not bool(self.covered.all()):
            raise AssertionError("schedule left query rows without any key")
        return self.out.to(dtype), self.lse


def forward_blocks(
    kernel: AttnKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: list[Block],
    scale: float,
    acc: ForwardAccumulator,
) -> None:
    """Attend the local queries to one K/V shard over ``blocks``, merging into ``acc``."""
    for blk in blocks:
        out, lse = kernel.forward(q[:, blk.q_rows], k[:, blk.k_rows], v[:, blk.k_rows], blk.causal, scale)
        acc.add(blk.q_rows, out, lse)


def backward_blocks(
    kernel: AttnKernel,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    blocks: list[Block],
    scale: float,
    dq_acc: torch.Tensor,
) -> list[tuple[slice, torch.Tensor, torch.Tensor]]:
    """Gradients of one K/V shard's blocks: dq is added to fp32 ``dq_acc`` (like q); returns the
    (k_rows, dk, dv) of each block for the caller to add where that K/V's gradient lives."""
    kv_grads = []
    for blk in blocks:
        qr, kr = blk.q_rows, blk.k_rows
        dq, dk, dv = kernel.backward(
            dout[:, qr], q[:, qr], k[:, kr], v[:, kr], out[:, qr], lse[:, :, qr], blk.causal, scale
        )
        dq_acc[:, qr] += dq
        kv_grads.append((kr, dk, dv))
    return kv_grads


def add_kv_grads_(dkv_acc: torch.Tensor, kv_grads: list[tuple[slice, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Add block (k_rows, dk, dv) gradients into the fp32 buffer ``dkv_acc`` (2, b, s_k, h_kv, d)."""
    for kr, dk, dv in kv_grads:
        dkv_acc[0][:, kr] += dk
        dkv_acc[1][:, kr] += dv
    return dkv_acc
