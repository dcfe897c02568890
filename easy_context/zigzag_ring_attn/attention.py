"""Zigzag ring attention: K/V travel the ring while each rank attends its zigzag queries to them.

Forward: W steps; step t attends to the K/V of rank (r - t) mod W while the next K/V is in flight
(``batch_isend_irecv`` double buffering); partial results merge in fp32. Only K/V heads travel (GQA).
Backward: K/V travel again; the dK/dV of each K/V shard travel with it in fp32, picking up every rank's
contribution, and arrive home after W steps.
Document masking: each step's blocks split into one sub-block per document shared by the query rows (zigzag
chunks r, 2W-1-r) and the visiting K/V's rows (chunks src, 2W-1-src); a step sharing no document computes nothing
(the K/V still travel on).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import RingExchange
from ..core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
from ..core.distributed_attn import distributed_attention
from ..core.documents import Documents, split_blocks
from ..kernels import AttnKernel
from .prepare_inputs import zigzag_spans
from .schedule import zigzag_blocks


def step_blocks(rank: int, src: int, world: int, q: torch.Tensor, causal: bool, documents: Documents | None,
                window: int | None = None):  # fmt: skip
    """The blocks rank ``rank`` computes against the K/V of rank ``src`` (split by ``documents`` and cut by a
    sliding ``window`` when given)."""
    blocks = zigzag_blocks(rank, src, q.shape[1], causal)
    if documents is None and window is None:
        return blocks
    s = q.shape[1]
    return split_blocks(blocks, zigzag_spans(rank, world, s), zigzag_spans(src, world, s), documents, q.shape[0],
                        window)  # fmt: skip


def _check_local_len(q: torch.Tensor, causal: bool) -> None:
    if causal and q.shape[1] % 2 != 0:
        raise ValueError(
            f"zigzag_ring_attn: local sequence length {q.shape[1]} is odd; shard the full sequence with "
            "easy_context.extract_local('zigzag_ring_attn', ...) after padding it with easy_context.pad_to_multiple"
        )


def ring_forward(
    q, k, v, kernel: AttnKernel, scale: float, causal: bool, group, documents: Documents | None = None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Local zigzag shards q (b, s, h, d), k/v (b, s, h_kv, d) -> out (b, s, h, d), lse (b, h, s) fp32."""
    ring = RingExchange(group)
    world, rank = ring.world_size, ring.rank
    kv = torch.stack([k, v])
    acc = ForwardAccumulator(q)
    for step in range(world):
        pending = ring.start(kv) if step + 1 < world else None
        src = (rank - step) % world
        forward_blocks(kernel, q, kv[0], kv[1], step_blocks(rank, src, world, q, causal, documents, window), scale,
                       acc)  # fmt: skip
        if pending is not None:
            kv = pending.wait()
    return acc.result(q.dtype)


def ring_backward(dout, q, k, v, out, lse, kernel: AttnKernel, scale: float, causal: bool, group, documents=None,
                  window: int | None = None):  # fmt: skip
    """Gradients of :func:`ring_forward`; dK/dV accumulate in fp32 while travelling the ring."""
    ring = RingExchange(group)
    world, rank = ring.world_size, ring.rank
    kv = torch.stack([k, v])
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dkv_pending = None
    for step in range(world):
        kv_pending = ring.start(kv) if step + 1 < world else None
        src = (rank - step) % world
        blocks = step_blocks(rank, src, world, q, causal, documents, window)
        kv_grads = backward_blocks(kernel, dout, q, kv[0], kv[1], out, lse, blocks, scale, dq)
        # the gradient of this K/V so far (from the ranks it visited before), else a fresh fp32 buffer
        dkv = dkv_pending.wait() if dkv_pending is not None else kv.new_zeros(kv.shape, dtype=torch.float32)
        add_kv_grads_(dkv, kv_grads)
        if world > 1:
            dkv_pending = ring.start(dkv)  # after the last step this delivers the K/V owner's gradient
        if kv_pending is not None:
            kv = kv_pending.wait()
    if dkv_pending is not None:
        dkv = dkv_pending.wait()
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def zigzag_ring_attention(
    q,
    k,
    v,
    kernel: AttnKernel,
    scale: float,
    causal: bool,
    group: dist.ProcessGroup,
    documents: Documents | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
):
    """Causal (or full) attention over the zigzag-sharded sequence of ``group``.

    q: (batch, seq_local, heads, dim), k/v: (batch, seq_local, heads_kv, dim) zigzag shards
    (``extract_local('zigzag_ring_attn', ...)``); returns q-shaped output. ``documents``: document masking
    (``core.documents``); ``window``: causal sliding window (``core.windows``; a step beyond
    it makes no kernel call); ``sinks`` (heads,): attention sinks, merged once (docs/attention_variants.md).
    """
    _check_local_len(q, causal)
    return distributed_attention(
        "zigzag_ring_attn", ring_forward, ring_backward, q, k, v, kernel, scale, causal, group, documents,
        window=window, sinks=sinks,
    )  # fmt: skip
