"""Explicit-softmax reference kernel ("math"): any device and dtype, O(seq_q * seq_k) memory.

Computes in float32 (float64 for float64 inputs). Used as the ground truth in tests and as the kernel of
last resort; never picked by ``kernel="auto"`` when a fused kernel exists, except for the variants only it computes
on CPU (logit soft-capping). Supports every variant of :mod:`easy_context.kernels.base`: soft-capping
(``s -> cap * tanh(s / cap)`` of the scaled scores; the backward multiplies by ``1 - tanh^2``) and band blocks.
"""

from __future__ import annotations

import torch

from easy_context.kernels.base import AttnKernel, Band, allowed_keys, repeat_kv, sum_kv_groups


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, softcap: float | None = None,
            band: Band | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Scores (b, h, sq, sk) in the accumulation dtype, masked with -inf; and tanh of the capped scores (or None)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kr = repeat_kv(k, q.shape[2] // k.shape[2])
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(acc), kr.to(acc)) * scale
    t = None
    if softcap is not None:
        t = torch.tanh(s / softcap)
        s = t * softcap
    ok = allowed_keys(q.shape[1], k.shape[1], causal, band, q.device)
    if ok is not None:
        s = s.masked_fill(~ok, float("-inf"))
    return s, t


def math_forward(q, k, v, causal: bool, scale: float, softcap: float | None = None, band: Band | None = None):
    s, _ = _scores(q, k, causal, scale, softcap, band)
    lse = torch.logsumexp(s, dim=-1)  # (b, h, sq)
    p = torch.exp(s - lse.unsqueeze(-1))
    vr = repeat_kv(v, q.shape[2] // v.shape[2]).to(p.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    return out.to(q.dtype), lse.float()


def math_backward(dout, q, k, v, out, lse, causal: bool, scale: float, softcap: float | None = None,
                  band: Band | None = None):  # fmt: skip
    s, t = _scores(q, k, causal, scale, softcap, band)
    acc = s.dtype
    p = torch.exp(s - lse.to(acc).unsqueeze(-1))  # probabilities w.r.t. the (merged) lse
    n_rep = q.shape[2] // k.shape[2]
    kr, vr = repeat_kv(k, n_rep).to(acc), repeat_kv(v, n_rep).to(acc)
    do = dout.to(acc)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vr)
    delta = (do * out.to(acc)).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    ds = p * (dp - delta) * scale
    if t is not None:  # d(cap * tanh(x / cap)) / dx = 1 - tanh^2
        ds = ds * (1 - t * t)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(acc))
    h_kv = k.shape[2]
    return dq.to(q.dtype), sum_kv_groups(dk, h_kv).to(k.dtype), sum_kv_groups(dv, h_kv).to(v.dtype)


MATH = AttnKernel("math", math_forward, math_backward, expands_kv=True, supports=frozenset({"softcap", "band"}))
