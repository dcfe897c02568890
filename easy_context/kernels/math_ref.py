"""Explicit-softmax reference kernel ("math"): any device and dtype, O(seq_q * seq_k) memory.

Computes in float32 (float64 for float64 inputs). Used as the ground truth in tests and as the kernel of
last resort; never picked by ``kernel="auto"`` when a fused kernel exists.
"""

from __future__ import annotations

import torch

from .base import AttnKernel, repeat_kv, sum_kv_groups


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kr = repeat_kv(k, q.shape[2] // k.shape[2])
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(acc), kr.to(acc)) * scale
    if causal:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def math_forward(q, k, v, causal: bool, scale: float):
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)  # (b, h, sq)
    p = torch.exp(s - lse.unsqueeze(-1))
    vr = repeat_kv(v, q.shape[2] // v.shape[2]).to(p.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    return out.to(q.dtype), lse.float()


def math_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    s = _scores(q, k, causal, scale)
    acc = s.dtype
    p = torch.exp(s - lse.to(acc).unsqueeze(-1))  # probabilities w.r.t. the (merged) lse
    n_rep = q.shape[2] // k.shape[2]
    kr, vr = repeat_kv(k, n_rep).to(acc), repeat_kv(v, n_rep).to(acc)
    do = dout.to(acc)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vr)
    delta = (do * out.to(acc)).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(acc))
    h_kv = k.shape[2]
    return dq.to(q.dtype), sum_kv_groups(dk, h_kv).to(k.dtype), sum_kv_groups(dv, h_kv).to(v.dtype)


MATH = AttnKernel("math", math_forward, math_backward, expands_kv=True)
