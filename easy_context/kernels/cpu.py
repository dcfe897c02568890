"""CPU kernel: PyTorch's fused flash attention for CPU (returns the fp32 natural-log LSE).

``aten::_scaled_dot_product_flash_attention_for_cpu`` takes (b, h, s, d) views and handles GQA without
repeating KV; its output is (b, h, s, d) with a (b, s, h, d) memory layout, so transposing back is free.
Band blocks (sliding windows) go in as an additive (sq, sk) mask of 0 / -inf in q's dtype (forward and backward);
logit soft-capping it cannot compute (the ``math`` kernel does).
"""

from __future__ import annotations

import torch

from easy_context.kernels.base import AttnKernel, Band, allowed_keys


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def _band_mask(q: torch.Tensor, k: torch.Tensor, band: Band | None) -> dict:
    if band is None:
        return {}
    ok = allowed_keys(q.shape[1], k.shape[1], False, band, q.device)
    return {"attn_mask": torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill_(~ok, float("-inf"))}


def cpu_forward(q, k, v, causal: bool, scale: float, band: Band | None = None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, scale=scale, **_band_mask(q, k, band)
    )
    return out.transpose(1, 2), lse


def cpu_backward(dout, q, k, v, out, lse, causal: bool, scale: float, band: Band | None = None):
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse.contiguous(), 0.0, causal, scale=scale,
        **_band_mask(q, k, band),
    )  # fmt: skip
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


CPU = AttnKernel("cpu", cpu_forward, cpu_backward, supports=frozenset({"band"}))
