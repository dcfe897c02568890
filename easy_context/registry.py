"""The backends by name, and the functional API over them."""

from __future__ import annotations

import torch

from . import data_parallel, dist_flash_attn, ulysses_attn, usp_attn, zigzag_ring_attn
from .seq_algo import AttnFunc, SeqAlgo

_ALGOS: dict[str, SeqAlgo] = {}


def register_seq_algo(algo: SeqAlgo) -> None:
    """Add a backend (its name becomes valid everywhere a ``seq_algo`` is taken)."""
    global SEQ_ALGOS
    _ALGOS[algo.name] = algo
    SEQ_ALGOS = tuple(_ALGOS)


for _mod in (zigzag_ring_attn, ulysses_attn, usp_attn, dist_flash_attn, data_parallel):
    register_seq_algo(_mod.ALGO)

SEQ_ALGOS: tuple[str, ...] = tuple(_ALGOS)


def get_seq_algo(seq_algo: str) -> SeqAlgo:
    if seq_algo not in _ALGOS:
        raise ValueError(f"unknown sequence-parallel mode {seq_algo!r}; choose one of {tuple(_ALGOS)}")
    return _ALGOS[seq_algo]


def extract_local(seq_algo: str, value: torch.Tensor, rank: int, world_size: int, dim: int = 1, **kw) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor (``dim`` is the sequence dimension)."""
    return get_seq_algo(seq_algo).extract_local(value, rank, world_size, dim, **kw)


def seq_multiple(seq_algo: str, world_size: int, **kw) -> int:
    """The number the full sequence length must be a multiple of for ``seq_algo`` on ``world_size`` ranks."""
    return get_seq_algo(seq_algo).seq_multiple(world_size, **kw)


def get_attn_func(seq_algo: str, kernel: str = "auto", **kw) -> AttnFunc:
    """``attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None, position_ids=None,
    documents=None)`` on local shards.

    q: (batch, seq_local, heads, dim); k/v: (batch, seq_local, heads_kv, dim); output has q's shape.
    Packed documents: ``position_ids`` (this rank's shard of the full sequence's, restarting at each document) or
    ``documents`` (:class:`easy_context.documents.Documents` of the full sequence) keep attention inside each
    document (docs/documents.md).
    ``kernel`` picks the local kernel (``auto``, ``cpu``, ``cudnn``, ``flash``, ``efficient``,
    ``flash_attn``, ``math``); other keywords are backend options (e.g. ``ring_degree`` for usp_attn).
    """
    return get_seq_algo(seq_algo).attn_func(kernel, **kw)
