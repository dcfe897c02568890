"""Zigzag ring attention: K/V travel the ring while each rank attends its zigzag queries to them.

Forward: W steps; step t attends to the K/V of rank (r - t) mod W while the next K/V is in flight
(``batch_isend_irecv`` double buffering); partial results merge in fp32. Only K/V heads travel (GQA).
Backward: K/V travel again; the dK/dV of each K/V shard travel with it in fp32, picking up every rank's
contribution, and arrive home after W steps.
Document masking: each step's blocks split into one sub-block per document shared by the query rows (zigzag
chunks r, 2W-1-r) and the visiting K/V's rows (chunks src, 2W-1-src); a step sharing no document computes nothing
(the K/V still travel on).
Sliding window: only the ring offsets s (source rank (r - s) mod W) at which some rank has a block under the window
are needed (:func:`window_offsets`; for a window up to a zigzag half-chunk: 1 and W - 1, the neighbours). When some
offset is not, the ring becomes one batched exchange with those offsets (:func:`easy_context.comm.start_exchange`)
overlapping the local step, and in the backward the same exchange, then one batch returning each visiting K/V's fp32
dK/dV to its owner. With every offset needed (long windows, W <= 3) the ring runs unchanged.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from easy_context.backends.zigzag_ring_attn.prepare_inputs import zigzag_spans
from easy_context.backends.zigzag_ring_attn.schedule import zigzag_blocks
from easy_context.comm import RingExchange, start_exchange
from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
from easy_context.core.distributed_attn import distributed_attention
from easy_context.core.documents import Documents, split_blocks
from easy_context.core.windows import window_blocks
from easy_context.kernels import AttnKernel


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


@lru_cache(maxsize=256)
def window_offsets(world: int, seq_local: int, causal: bool, window: int | None) -> tuple[int, ...] | None:
    """The ring offsets s in 1..W-1 at which ANY rank r has a block against the K/V of rank (r - s) mod W under a
    causal sliding ``window`` (window-only geometry: documents only remove blocks), sorted; None when every offset
    is needed (no window, full attention, or a window reaching every source): the ring. The same on every rank."""
    if window is None or not causal or world == 1:
        return None
    spans = [zigzag_spans(r, world, seq_local) for r in range(world)]
    needed = tuple(
        s for s in range(1, world)
        if any(window_blocks(zigzag_blocks(r, (r - s) % world, seq_local, True), spans[r], spans[(r - s) % world],
                             window) for r in range(world))
    )  # fmt: skip
    return None if len(needed) == world - 1 else needed


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
    """Local zigzag shards q (b, s, h, d), k/v (b, s, h_kv, d) -> out (b, s, h, d), lse (b, h, s) fp32.
    With a ``window`` leaving some ring offsets without blocks, K/V come only from the needed sources
    (:func:`window_offsets`) in one exchange."""
    ring = RingExchange(group)
    world, rank = ring.world_size, ring.rank
    kv = torch.stack([k, v])
    acc = ForwardAccumulator(q)
    offsets = window_offsets(world, q.shape[1], causal, window)
    if offsets is not None:
        pending = start_exchange({s: kv for s in offsets}, group)  # kv (2, b, s, h_kv, d) to rank + s
        forward_blocks(kernel, q, k, v, step_blocks(rank, rank, world, q, causal, documents, window), scale, acc)
        for s, kv_src in pending.wait().items():  # from rank - s, in ring-step order
            src = (rank - s) % world
            forward_blocks(kernel, q, kv_src[0], kv_src[1], step_blocks(rank, src, world, q, causal, documents,
                                                                        window), scale, acc)  # fmt: skip
        return acc.result(q.dtype)
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
    """Gradients of :func:`ring_forward`; dK/dV accumulate in fp32 while travelling the ring. With a ``window``
    leaving some ring offsets without blocks: the forward's K/V exchange again (the autograd function keeps only
    the local K/V), then one exchange returning each visiting K/V's fp32 dK/dV to its owner."""
    ring = RingExchange(group)
    world, rank = ring.world_size, ring.rank
    kv = torch.stack([k, v])
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    offsets = window_offsets(world, q.shape[1], causal, window)
    if offsets is not None:
        return _exchange_backward(dout, q, kv, out, lse, kernel, scale, causal, group, documents, window, offsets, dq)
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


def _exchange_backward(dout, q, kv, out, lse, kernel: AttnKernel, scale: float, causal: bool, group, documents,
                       window: int, offsets: tuple[int, ...], dq: torch.Tensor):  # fmt: skip
    """:func:`ring_backward` over the needed ``offsets`` only; kv (2, b, s, h_kv, d) local, dq fp32 zeros."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    pending = start_exchange({s: kv for s in offsets}, group)
    dkv = kv.new_zeros(kv.shape, dtype=torch.float32)  # this rank's K/V gradient, fp32
    blocks = step_blocks(rank, rank, world, q, causal, documents, window)
    add_kv_grads_(dkv, backward_blocks(kernel, dout, q, kv[0], kv[1], out, lse, blocks, scale, dq))
    grads = {}  # offset W - s: back to the owner rank - s
    for s, kv_src in pending.wait().items():
        blocks = step_blocks(rank, (rank - s) % world, world, q, causal, documents, window)
        kv_grads = backward_blocks(kernel, dout, q, kv_src[0], kv_src[1], out, lse, blocks, scale, dq)
        grads[world - s] = add_kv_grads_(kv.new_zeros(kv.shape, dtype=torch.float32), kv_grads)
    for partial in start_exchange(grads, group).wait().values():  # from rank + s: its share of this K/V's gradient
        dkv += partial
    return dq.to(q.dtype), dkv[0].to(kv.dtype), dkv[1].to(kv.dtype)


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
    (``core.documents``); ``window``: causal sliding window (``core.windows``; a step beyond it makes no kernel
    call, and K/V go only to the ranks that use them: :func:`window_offsets`); ``sinks`` (heads,): attention
    sinks, merged once (docs/attention_variants.md).
    """
    _check_local_len(q, causal)
    return distributed_attention(
        "zigzag_ring_attn", ring_forward, ring_backward, q, k, v, kernel, scale, causal, group, documents,
        window=window, sinks=sinks,
    )  # fmt: skip
