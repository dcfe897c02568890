"""Zigzag ring attention on W *virtual* ranks in one process: the same blocks, no communication.

Used to check the schedule on a single GPU and to measure its step efficiency against one monolithic
kernel call (bench/attention.py). Inputs are lists of per-rank zigzag shards (b, s_local, h, d).
"""

from __future__ import annotations

import torch

from easy_context.backends.zigzag_ring_attn.attention import step_blocks
from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
from easy_context.core.documents import Documents
from easy_context.kernels import AttnKernel


def virtual_forward(
    qs, ks, vs, kernel: AttnKernel, scale: float, causal: bool = True, documents: Documents | None = None,
    window: int | None = None,
):  # fmt: skip
    """Per-rank (out, lse) lists, computed step by step as the ring would (``documents``: document masking;
    ``window``: causal sliding window, a step beyond it makes no kernel call)."""
    world = len(qs)
    accs = [ForwardAccumulator(q) for q in qs]
    for step in range(world):
        for rank in range(world):
            src = (rank - step) % world
            blocks = step_blocks(rank, src, world, qs[rank], causal, documents, window)
            forward_blocks(kernel, qs[rank], ks[src], vs[src], blocks, scale, accs[rank])
    results = [acc.result(q.dtype) for acc, q in zip(accs, qs)]
    return [r[0] for r in results], [r[1] for r in results]


def virtual_backward(douts, qs, ks, vs, outs, lses, kernel: AttnKernel, scale: float, causal: bool = True,
                     documents: Documents | None = None, window: int | None = None):  # fmt: skip
    """Per-rank (dq, dk, dv) lists; dK/dV accumulate in fp32 per K/V owner, as they would on the ring."""
    world = len(qs)
    dqs = [torch.zeros(q.shape, dtype=torch.float32, device=q.device) for q in qs]
    dkvs = [torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device) for k in ks]
    for step in range(world):
        for rank in range(world):
            src = (rank - step) % world
            blocks = step_blocks(rank, src, world, qs[rank], causal, documents, window)
            kv_grads = backward_blocks(
                kernel, douts[rank], qs[rank], ks[src], vs[src], outs[rank], lses[rank], blocks, scale, dqs[rank]
            )
            add_kv_grads_(dkvs[src], kv_grads)
    return (
        [dq.to(q.dtype) for dq, q in zip(dqs, qs)],
        [dkv[0].to(k.dtype) for dkv, k in zip(dkvs, ks)],
        [dkv[1].to(k.dtype) for dkv, k in zip(dkvs, ks)],
    )
