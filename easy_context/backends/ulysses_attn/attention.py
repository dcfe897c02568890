"""Ulysses (DeepSpeed-Ulysses) attention: all-to-all from sequence shards to head shards and back.

Each rank trades its (b, s/W, h, d) shard for (b, s, h/W, d): the full sequence for h/W heads, runs any
attention on it, and trades back. K/V heads (GQA) travel un-repeated when ``h_kv % W == 0``; when W is a
multiple of ``h_kv`` each K/V head is replicated ``W / h_kv`` times so every rank gets the one its query
heads use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from easy_context.comm import SeqAllToAll
from easy_context.core.documents import Documents
from easy_context.core.layout import ulysses_heads
from easy_context.core.local_attn import local_attention
from easy_context.kernels import AttnKernel


def kv_replication(heads_q: int, heads_kv: int, world: int, algo: str = "ulysses_attn") -> int:
    """How many times to replicate each K/V head before the all-to-all (1 = none); clear errors otherwise."""
    rep, why = ulysses_heads(heads_q, heads_kv, world)
    if why:
        raise ValueError(f"{algo}: {why}")
    return rep


def ulysses_wrap(q, k, v, group: dist.ProcessGroup, inner: Callable[..., torch.Tensor], algo: str = "ulysses_attn",
                 sinks: torch.Tensor | None = None):  # fmt: skip
    """Head-scatter q/k/v over ``group``, run ``inner(q, k, v, sinks)`` on the full sequence, gather back.

    ``sinks`` (heads,): per-query-head attention sinks; ``inner`` gets this rank's heads of them (rank r holds query
    heads ``r * h / W .. (r + 1) * h / W - 1``; a slice, so the other heads' gradient is zero here and comes from
    their rank through the usual gradient all-reduce), or None.
    """
    world = dist.get_world_size(group)
    rep = kv_replication(q.shape[2], k.shape[2], world, algo)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    if sinks is not None:
        per_rank = q.shape[2] // world
        rank = dist.get_rank(group)
        sinks = sinks[rank * per_rank : (rank + 1) * per_rank]
    q, k, v = (SeqAllToAll.apply(x.contiguous(), 2, 1, group) for x in (q, k, v))
    out = inner(q, k, v, sinks)
    return SeqAllToAll.apply(out.contiguous(), 1, 2, group)


def ulysses_attention(
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
    """Attention over the contiguously sharded sequence of ``group`` via head all-to-all.

    q: (batch, seq_local, heads, dim), k/v: (batch, seq_local, heads_kv, dim); returns q-shaped output.
    ``documents``: document masking (the local call over the full sequence runs one kernel call per document);
    ``window``: causal sliding window; ``sinks`` (heads,): attention sinks (docs/attention_variants.md).
    """

    def inner(q_, k_, v_, sinks_):
        return local_attention(q_, k_, v_, kernel, scale, causal, documents=documents, window=window, sinks=sinks_)

    return ulysses_wrap(q, k, v, group, inner, sinks=sinks)
