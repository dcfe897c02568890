"""Checkpoint-after-attention: activation checkpointing that does not re-run distributed attention.

Plain activation checkpointing of a decoder layer re-runs its whole forward during the backward, and the
distributed attention forward (all its communication and kernel calls) with it. Under
:func:`checkpoint_after_attention` the first forward of the layer *records* the (out, lse) of each
distributed attention call; the recompute *replays* them: the attention returns the recorded output
without computing, while its autograd node still saves (q, k, v, out, lse), so the backward runs the
backend's distributed backward as usual. Everything else in the layer (projections, MLP, norms) is
recomputed as with ordinary checkpointing.

Memory cost: per checkpointed layer and attention call, one output (batch, seq_local, heads, head_dim) in
the activation dtype plus one lse (batch, heads, seq_local) in float32, held from the layer's forward to
its backward (the output shares storage with the tensor the layer's forward produced).

Hook for a backend (two lines in its ``torch.autograd.Function.forward``)::

    from ...attn_checkpoint import forward_or_replay
    out, lse = forward_or_replay("my_backend", q, lambda: distributed_forward(q, k, v, ...))
    ctx.save_for_backward(q, k, v, out, lse)

Outside a checkpointed layer ``forward_or_replay`` simply calls the function.
"""

from __future__ import annotations

import contextvars
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

_ACTIVE: contextvars.ContextVar[tuple[AttnCache, str] | None] = contextvars.ContextVar("ec_attn_cache", default=None)


@dataclass(frozen=True)
class _Entry:
    tag: str
    out: torch.Tensor  # (b, s_local, h, d), detached
    lse: torch.Tensor  # (b, h, s_local) fp32, detached
    version: int  # out's version counter when recorded (detects in-place changes)
    documents: Any = None  # the document masking it computed (easy_context.core.documents.Documents or None)


class _Mode:
    """A re-enterable context manager making ``cache`` active in ``mode`` ("record" or "replay")."""

    def __init__(self, cache: AttnCache, mode: str):
        self.cache, self.mode = cache, mode
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> None:
        self.cache.cursor = 0
        self._tokens.append(_ACTIVE.set((self.cache, self.mode)))

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._tokens.pop())


class AttnCache:
    """The (out, lse) of every attention call of one checkpointed forward, in call order."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.cursor = 0

    def contexts(self) -> tuple[_Mode, _Mode]:
        """``context_fn`` for :func:`torch.utils.checkpoint.checkpoint`: (record in forward, replay in recompute)."""
        return _Mode(self, "record"), _Mode(self, "replay")


def forward_or_replay(
    tag: str, q: torch.Tensor, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]], documents: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute()`` -> (out (b, s, h, d), lse (b, h, s) fp32), or its recorded result during a recompute.

    ``tag`` names the backend, ``q`` is the local query and ``documents`` the document masking of the call, all
    only used to check that the recompute calls attention in the same order, and over the same documents, as
    the forward did.
    """
    active = _ACTIVE.get()
    if active is None:
        return compute()
    cache, mode = active
    if mode == "record":
        out, lse = compute()
        cache.entries.append(_Entry(tag, out.detach(), lse.detach(), out._version, documents))
        return out, lse
    if cache.cursor >= len(cache.entries):
        raise RuntimeError(
            f"attn_checkpoint: the recompute called {tag} attention more often than the forward did "
            f"({len(cache.entries)} calls); the checkpointed forward must be deterministic"
        )
    entry = cache.entries[cache.cursor]
    cache.cursor += 1
    if entry.tag != tag or entry.out.shape != q.shape or entry.out.device != q.device:
        raise RuntimeError(
            f"attn_checkpoint: recompute call {cache.cursor} is {tag} attention with q{tuple(q.shape)}, "
            f"but the forward recorded {entry.tag} with out{tuple(entry.out.shape)}"
        )
    if entry.documents != documents:
        raise RuntimeError(
            f"attn_checkpoint: recompute call {cache.cursor} of {tag} attention masks other documents than the "
            "forward did (the position_ids changed between the forward and the recompute)"
        )
    if entry.out._version != entry.version:
        raise RuntimeError(
            f"attn_checkpoint: the output of {tag} attention was modified in place after the forward; "
            "clone it before modifying it inside a checkpoint_after_attention layer"
        )
    return entry.out.detach(), entry.lse.detach()


def _checkpointed_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    inner = self._ec_inner_forward
    if not torch.is_grad_enabled():  # inference: nothing to checkpoint, nothing to record
        return inner(*args, **kwargs)
    return checkpoint(inner, *args, use_reentrant=False, context_fn=AttnCache().contexts, **kwargs)


def checkpoint_after_attention(layer: torch.nn.Module) -> torch.nn.Module:
    """Make ``layer`` activation-checkpointed (non-reentrant) without re-running its distributed attention.

    Patches ``layer.forward`` in place and returns ``layer`` (parameter names and hooks are unchanged;
    applying it twice is a no-op). Do not also enable another checkpointing of the same layer (e.g. a
    model's ``gradient_checkpointing_enable``). See the module docstring for the memory cost.
    """
    if getattr(layer, "_ec_inner_forward", None) is None:
        layer._ec_inner_forward = layer.forward
        layer.forward = types.MethodType(_checkpointed_forward, layer)
    return layer
