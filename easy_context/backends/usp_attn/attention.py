"""USP (unified sequence parallel): Ulysses all-to-all inside, zigzag ring attention across.

The SP group of size W = ring_degree x ulysses_degree is split into Ulysses groups (consecutive ranks)
and ring groups. Heads only need to divide by ulysses_degree, and the ring carries the rest of the
parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from easy_context.backends.ulysses_attn.attention import ulysses_wrap
from easy_context.backends.usp_attn.prepare_inputs import resolve_ring_degree
from easy_context.backends.zigzag_ring_attn.attention import zigzag_ring_attention
from easy_context.core.documents import Documents
from easy_context.core.groups import get_usp_groups
from easy_context.kernels import AttnKernel


def usp_attention(
    q, k, v, kernel: AttnKernel, scale: float, causal: bool, group: dist.ProcessGroup, ring_degree: int | None = None,
    documents: Documents | None = None, window: int | None = None, sinks: torch.Tensor | None = None,
):  # fmt: skip
    """Attention over the USP-sharded sequence of ``group`` (``extract_local('usp_attn', ..., ring_degree=R)``).

    q: (batch, seq_local, heads, dim), k/v: (batch, seq_local, heads_kv, dim); returns q-shaped output.
    ``documents``: document masking; after the all-to-all, ring rank j holds zigzag shard j of the full sequence
    over the ring, so the ring attention splits its blocks by the same (global) documents, and cuts them by the same
    ``window``. ``sinks`` (heads,): each Ulysses rank's heads of them merge once at the end of its ring.
    """
    world = dist.get_world_size(group)
    ring_degree = resolve_ring_degree(world, ring_degree)
    groups = get_usp_groups(group, ring_degree)

    def ring(q_, k_, v_, sinks_):
        return zigzag_ring_attention(q_, k_, v_, kernel, scale, causal, groups.ring, documents=documents,
                                     window=window, sinks=sinks_)  # fmt: skip

    return ulysses_wrap(q, k, v, groups.ulysses, ring, algo="usp_attn", sinks=sinks)
