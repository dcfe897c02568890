"""Single-device attention through a local kernel (data parallel, Ulysses' inner call), on the shared autograd
function of :mod:`easy_context.core.distributed_attn` (one save-(out, lse) backward, one checkpoint replay).

Under document masking the sequence is the full one, so each document is one causal (or full) square of its own
rows: one kernel call per document, rows disjoint, nothing to merge. A sliding window cuts the sequence (or each
document) into diagonal tiles and the bands below them (:mod:`easy_context.core.windows`), merged block-wise in fp32.
"""

from __future__ import annotations

import torch

from easy_context.core.block import Block
from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
from easy_context.core.distributed_attn import distributed_attention
from easy_context.core.documents import Documents, split_blocks
from easy_context.core.spans import Span
from easy_context.kernels import AttnKernel


def _document_blocks(q: torch.Tensor, causal: bool, documents: Documents | None, window: int | None = None):
    s = q.shape[1]
    whole = (Span(0, 0, s),)
    return split_blocks([Block(slice(0, s), slice(0, s), causal)], whole, whole, documents, q.shape[0], window)


def _kernel_forward(q, k, v, kernel: AttnKernel, scale: float, causal: bool, group, documents: Documents | None = None,
                    window: int | None = None):  # fmt: skip
    if documents is None and window is None:
        return kernel.forward(q, k, v, causal, scale)
    blocks = _document_blocks(q, causal, documents, window)
    if window is not None:  # tiles and bands share query rows: merge
        acc = ForwardAccumulator(q)
        forward_blocks(kernel, q, k, v, blocks, scale, acc)
        return acc.result(q.dtype)
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    for blk in blocks:
        b, rows = blk.batch, blk.q_rows
        out[b, rows], lse[b, :, rows] = kernel.forward(q[b, rows], k[b, rows], v[b, rows], blk.causal, scale)
    return out, lse


def _kernel_backward(
    dout, q, k, v, out, lse, kernel: AttnKernel, scale: float, causal: bool, group, documents: Documents | None = None,
    window: int | None = None,
):  # fmt: skip
    if documents is None and window is None:
        return kernel.backward(dout, q, k, v, out, lse, causal, scale)
    blocks = _document_blocks(q, causal, documents, window)
    if window is not None:
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv_grads = backward_blocks(kernel, dout, q, k, v, out, lse, blocks, scale, dq)
        dkv = add_kv_grads_(torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device), kv_grads)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for blk in blocks:
        b, r = blk.batch, blk.q_rows
        dq[b, r], dk[b, r], dv[b, r] = kernel.backward(
            dout[b, r], q[b, r], k[b, r], v[b, r], out[b, r], lse[b, :, r], blk.causal, scale
        )
    return dq, dk, dv


def local_attention(
    q, k, v, kernel: AttnKernel, scale: float, causal: bool, group=None, documents: Documents | None = None,
    window: int | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Attention of the whole (local) sequence, (b, s, h, d) layouts, k/v may have fewer heads; ``group`` is
    ignored. ``documents``: each attends only to itself (:mod:`easy_context.core.documents`); ``window``: causal sliding
    window; ``sinks`` (heads,): attention sinks (docs/attention_variants.md)."""
    return distributed_attention(
        "local", _kernel_forward, _kernel_backward, q, k, v, kernel, scale, causal, group, documents, window, sinks
    )
