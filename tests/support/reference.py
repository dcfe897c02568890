"""Single-device reference attention in float64 with plain autograd (independent of easy_context)."""

from __future__ import annotations

import torch


def reference_attention(q, k, v, causal: bool, scale: float | None = None) -> torch.Tensor:
    """q (b, s, h, d), k/v (b, s, h_kv, d) -> (b, s, h, d), computed in float64."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    rep = q.shape[2] // k.shape[2]
    k64, v64 = k64.repeat_interleave(rep, 2), v64.repeat_interleave(rep, 2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
    if causal:
        s = s.masked_fill(torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v64)


def reference_with_grads(q, k, v, dout, causal: bool, scale: float | None = None):
    """(out, dq, dk, dv) of the float64 reference for inputs q/k/v and upstream gradient dout."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = reference_attention(*leaves, causal=causal, scale=scale)
    out.backward(dout.double())
    return out.detach(), *(x.grad for x in leaves)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| in float64."""
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()
