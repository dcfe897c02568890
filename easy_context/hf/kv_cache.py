"""Greedy decoding after a sequence-parallel prefill, with the KV cache left sharded where the prefill put it.

transformers' KV caches assume one device holds the whole sequence; under SP each rank holds a shard (zigzag
chunks, a contiguous block, ...). :class:`ShardedKVCache` works inside easy_context's attention function instead:

* **prefill** (``cache.prefill(length)``): each attention call runs as usual and records this rank's keys and values
  (after RoPE, ``(batch, seq_local, kv_heads, head_dim)``) with the global position of every row; pad rows
  (positions >= ``length``) are dropped.
* **decode** (``cache.decode()``): the model runs on the one new token, the same on every rank (lockstep). Each
  layer's query attends to this rank's recorded keys (the decoded tokens' keys are kept by SP rank 0), with the
  model's soft-cap and sliding window; the per-rank ``(out, lse)`` are all-gathered and combined with the one fp32
  LSE merge (:mod:`easy_context.core.lse_merge`), then the sinks (gpt-oss) once. So no rank holds the whole cache
  and the result is attention over every key.

Memory per rank: its share of the prompt's K/V plus (rank 0) the generated tokens'. The decode call costs one
all-gather of ``(batch, 1, heads, head_dim)`` per layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from easy_context.core.groups import get_sp_group
from easy_context.core.lse_merge import merge_safe_, merge_sinks
from easy_context.kernels.math_ref import MATH

_ACTIVE: list[ShardedKVCache] = []


def active_cache() -> ShardedKVCache | None:
    """The cache of the innermost :meth:`ShardedKVCache.prefill` / :meth:`ShardedKVCache.decode` block, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class ShardedKVCache:
    """Per-layer K/V shards of one sequence (batch 1) on this rank, for greedy decoding under any backend.

    ``distributed``: True when the ranks of the SP group share the sequence (their results are merged); False for
    one process holding the whole sequence (data parallel).
    """

    def __init__(self, distributed: bool):
        self.distributed = distributed and dist.is_initialized() and dist.get_world_size(get_sp_group()) > 1
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (1, n_local, kv_heads, head_dim)
        self.values: dict[int, torch.Tensor] = {}
        self.positions: dict[int, torch.Tensor] = {}  # layer -> (n_local,) global positions
        self.length = 0  # real tokens of the prompt (positions beyond are padding)
        self.mode: str | None = None

    @contextlib.contextmanager
    def _active(self, mode: str) -> Iterator[ShardedKVCache]:
        self.mode = mode
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.pop()
            self.mode = None

    def prefill(self, length: int):
        """Context manager: the forward inside records K/V of positions ``< length`` (the prompt's real tokens)."""
        self.length = length
        self.keys.clear(), self.values.clear(), self.positions.clear()
        return self._active("prefill")

    def decode(self):
        """Context manager: each forward inside is one new token (same on every rank) attending to the cache."""
        return self._active("decode")

    @property
    def owns_new_tokens(self) -> bool:
        """The rank that keeps the decoded tokens' K/V: SP rank 0."""
        return not self.distributed or dist.get_rank(get_sp_group()) == 0

    def attend(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        position_ids: torch.Tensor | None,
        scale: float,
        variants: dict[str, Any],
        attention: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """The attention output ``(1, seq_local, heads, head_dim)`` of one layer's call, recording or using the cache.

        query ``(1, seq_local, heads, head_dim)``; key/value ``(1, seq_local, kv_heads, head_dim)``; position_ids
        ``(1, seq_local)`` global; ``attention()`` computes the call as without a cache (prefill).
        """
        if query.shape[0] != 1 or position_ids is None:
            raise ValueError("ShardedKVCache decodes one sequence (batch 1) and needs its global position_ids")
        positions = position_ids.reshape(-1)
        if self.mode == "prefill":
            keep = positions < self.length
            self.keys[layer], self.values[layer] = key[:, keep].detach(), value[:, keep].detach()
            self.positions[layer] = positions[keep]
            return attention()
        if query.shape[1] != 1:
            raise ValueError(f"decode runs one new token per forward, got {query.shape[1]}")
        if self.owns_new_tokens:
            self.keys[layer] = torch.cat([self.keys[layer], key.detach()], dim=1)
            self.values[layer] = torch.cat([self.values[layer], value.detach()], dim=1)
            self.positions[layer] = torch.cat([self.positions[layer], positions])
        return self._decode_attention(layer, query, int(positions[0]), scale, variants)

    def _decode_attention(self, layer: int, query: torch.Tensor, position: int, scale: float,
                          variants: dict[str, Any]) -> torch.Tensor:  # fmt: skip
        keys, values, positions = self.keys[layer], self.values[layer], self.positions[layer]
        window = variants.get("sliding_window")
        allowed = positions <= position
        if window:
            allowed &= positions > position - window  # transformers' window: the last `window` positions
        keys, values = keys[:, allowed], values[:, allowed]
        heads = query.shape[2]
        if keys.shape[1]:
            out, lse = MATH.with_softcap(variants.get("softcap")).forward(query, keys, values, False, scale)
            out = out.float()
        else:  # a rank whose shard holds no key this query may see
            out = query.new_zeros(query.shape, dtype=torch.float32)
            lse = torch.full((1, heads, 1), float("-inf"), device=query.device)
        if self.distributed:
            group = get_sp_group()
            world = dist.get_world_size(group)
            outs = [torch.empty_like(out) for _ in range(world)]
            lses = [torch.empty_like(lse) for _ in range(world)]
            dist.all_gather(outs, out.contiguous(), group=group)
            dist.all_gather(lses, lse.contiguous(), group=group)
            out = torch.zeros_like(out)
            lse = torch.full_like(lse, float("-inf"))
            for part_out, part_lse in zip(outs, lses):  # rank order: the same sum on every rank
                merge_safe_(out, lse, part_out, part_lse)
        sinks = variants.get("sinks")
        if sinks is not None:
            out, lse = merge_sinks(out, lse, sinks)
        return out.to(query.dtype)
