"""Block-wise attention: the compute of one schedule step, shared by every ring-style backend.

A schedule says, for each step, which (query rows x key rows) blocks a rank computes against the K/V it
holds. The forward merges each block into fp32 accumulators; the backward feeds the *final* output and
LSE of those rows to the kernel's backward, which makes the per-block gradients exact, and accumulates
them in fp32. Communication lives elsewhere (``comm``), so the same functions also drive single-process
"virtual rank" simulations in tests and benchmarks.

Under document masking (:mod:`easy_context.core.documents`) a block becomes sub-blocks, one per document: a query row
may then get nothing from one K/V shard, so the accumulator tracks which rows were written and merges rows with
no keys yet (lse -inf) without NaN.
"""

from __future__ import annotations

import torch

from easy_context.core.block import ALL, Block
from easy_context.core.lse_merge import merge_into_, merge_safe_
from easy_context.core.windows import tile_bands
from easy_context.kernels import AttnKernel


class ForwardAccumulator:
    """fp32 running (out, lse) of the local queries: out (b, s_q, h, d), lse (b, h, s_q).

    Rows never written hold (0, -inf). ``written`` tracks rows with any contribution (then a block merges
    instead of copying), ``covered`` rows with a kernel result (a finite lse).
    """

    def __init__(self, q: torch.Tensor):
        self.out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        self.lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device)
        self.written = torch.zeros(q.shape[:2], dtype=torch.bool)  # host-side, (b, s_q)
        self.covered = torch.zeros(q.shape[:2], dtype=torch.bool)

    def add(self, rows: slice, out: torch.Tensor, lse: torch.Tensor, batch: slice = ALL, complete: bool = True) -> None:
        """Merge a result for query ``rows`` of batch rows ``batch``. ``complete``: every row of it has a key (a
        kernel's result); False for a partial merged result that may hold rows without any (lse -inf)."""
        written = self.written[batch, rows]
        acc_out, acc_lse = self.out[batch, rows], self.lse[batch, :, rows]
        if not bool(written.any()):  # first contribution to these rows: copy, no exp(-inf - -inf)
            acc_out.copy_(out)
            acc_lse.copy_(lse)
        elif complete:  # a finite lse merges safely even into rows still at (0, -inf)
            merge_into_(acc_out, acc_lse, out, lse)
        else:
            merge_safe_(acc_out, acc_lse, out, lse)
        self.written[batch, rows] = True
        if complete:
            self.covered[batch, rows] = True

    def result(self, dtype: torch.dtype, require_covered: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(out in ``dtype``, fp32 lse). ``require_covered=False`` for a partial result (rows without keys allowed:
        they come back as (0, -inf))."""
        if require_covered and not bool(self.covered.all()):
            raise AssertionError("schedule left query rows without any key")
        return self.out.to(dtype), self.lse


KVGrad = tuple[slice, slice, torch.Tensor, torch.Tensor]  # (batch, k_rows, dk, dv) of one block


def kernel_blocks(kernel: AttnKernel, blocks: list[Block]) -> list[Block]:
    """The calls ``kernel`` makes for ``blocks``: long causal band blocks tiled unless the kernel skips the tiles
    outside a band itself (:func:`easy_context.core.windows.tile_bands`)."""
    if kernel.skips_band_tiles or not any(blk.band is not None and blk.causal for blk in blocks):
        return blocks
    return tile_bands(blocks)


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
    for blk in kernel_blocks(kernel, blocks):
        b, kr = blk.batch, blk.k_rows
        out, lse = kernel.forward(q[b, blk.q_rows], k[b, kr], v[b, kr], blk.causal, scale, blk.band)
        acc.add(blk.q_rows, out, lse, b)


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
) -> list[KVGrad]:
    """Gradients of one K/V shard's blocks: dq is added to fp32 ``dq_acc`` (like q); returns the
    (batch, k_rows, dk, dv) of each block for the caller to add where that K/V's gradient lives."""
    kv_grads = []
    for blk in kernel_blocks(kernel, blocks):
        b, qr, kr = blk.batch, blk.q_rows, blk.k_rows
        dq, dk, dv = kernel.backward(
            dout[b, qr], q[b, qr], k[b, kr], v[b, kr], out[b, qr], lse[b, :, qr], blk.causal, scale, blk.band
        )
        dq_acc[b, qr] += dq
        kv_grads.append((b, kr, dk, dv))
    return kv_grads


def add_kv_grads_(dkv_acc: torch.Tensor, kv_grads: list[KVGrad]) -> torch.Tensor:
    """Add block (batch, k_rows, dk, dv) gradients into the fp32 buffer ``dkv_acc`` (2, b, s_k, h_kv, d)."""
    for b, kr, dk, dv in kv_grads:
        dkv_acc[0][b, kr] += dk
        dkv_acc[1][b, kr] += dv
    return dkv_acc
