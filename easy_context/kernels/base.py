"""The local attention kernel interface every sequence-parallel backend computes with.

Layouts (flash-attn convention):
    q:   (batch, seq_q, heads_q, head_dim)
    k/v: (batch, seq_k, heads_kv, head_dim), heads_q % heads_kv == 0 (GQA/MQA allowed)
    out: (batch, seq_q, heads_q, head_dim), dtype of q
    lse: (batch, heads_q, seq_q), float32, natural-log log-sum-exp of the scaled scores

``causal=True`` requires ``seq_q == seq_k`` (a diagonal block): sequence-parallel schedules only ever ask
for square causal blocks, and kernels disagree on how to align a rectangular causal mask.
The backward receives the *final* (possibly merged) ``out`` and ``lse`` of the query rows, which is what
makes block-wise backward of ring schedules exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]]
BackwardFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool, float],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]


@dataclass(frozen=True)
class AttnKernel:
    """A local attention kernel that returns the log-sum-exp.

    ``forward(q, k, v, causal, softmax_scale) -> (out, lse)``
    ``backward(dout, q, k, v, out, lse, causal, softmax_scale) -> (dq, dk, dv)`` (dk/dv have k's heads).
    """

    name: str
    forward_impl: ForwardFn
    backward_impl: BackwardFn

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_shapes(q, k, v, causal)
        return self.forward_impl(q, k, v, causal, softmax_scale)

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        softmax_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.backward_impl(dout, q, k, v, out, lse, causal, softmax_scale)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    """Raise a clear error for inputs no kernel can take."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention expects (batch, seq, heads, head_dim) tensors, got q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"incompatible q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]}) for GQA")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal local attention needs seq_q == seq_k, got {q.shape[1]} and {k.shape[1]}")


def default_scale(head_dim: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, s, h_kv, d) -> (b, s, h_kv * n_rep, d), each KV head repeated for its query group."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=2)


def sum_kv_groups(dx: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """Inverse of :func:`repeat_kv` for gradients: (b, s, h_kv * n_rep, d) -> (b, s, h_kv, d)."""
    b, s, h, d = dx.shape
    return dx if h == heads_kv else dx.view(b, s, heads_kv, h // heads_kv, d).sum(dim=3)
