"""CUDA kernels from PyTorch's SDPA family, called through their aten ops so the LSE comes back.

* ``cudnn``     -- ``aten::_scaled_dot_product_cudnn_attention`` (fastest on Hopper; LSE is (b, h, s, 1))
* ``flash``     -- ``aten::_scaled_dot_product_flash_attention`` (FlashAttention-2 inside PyTorch)
* ``efficient`` -- ``aten::_scaled_dot_product_efficient_attention`` (xFormers/CUTLASS; also fp32; its
  LSE is padded to a multiple of 32 rows)

All take (b, h, s, d) views of our (b, s, h, d) tensors. Dropout is always 0, so the RNG outputs of the
forward are never needed: the backward gets scalar placeholders, ``None`` for the absent bias and for the
cumulative sequence lengths (those mark nested/varlen inputs). Probed on an H200 with torch 2.11:
cuDNN and flash accept un-repeated GQA K/V; efficient needs them repeated. cuDNN's backward refuses a 1 x 1 block
(``s_q = s_kv = 1``: a one-token document under document masking): that block goes to the math kernel.
"""

from __future__ import annotations

import torch

from easy_context.kernels.base import AttnKernel, repeat_kv, sum_kv_groups
from easy_context.kernels.math_ref import math_backward

aten = torch.ops.aten


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def _expand_gqa(q, k, v):
    n_rep = q.shape[2] // k.shape[2]
    return repeat_kv(k, n_rep), repeat_kv(v, n_rep)


def _rng_placeholder(ref: torch.Tensor) -> torch.Tensor:
    """Philox seed/offset stand-in (unused with dropout 0): a 0-dim int64 tensor, as the forward returns."""
    return torch.zeros((), dtype=torch.int64, device=ref.device)


# --- cuDNN -----------------------------------------------------------------------------------------
def cudnn_forward(q, k, v, causal: bool, scale: float):
    res = aten._scaled_dot_product_cudnn_attention(
        _bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal, False, scale=scale
    )
    out, lse = res[0], res[1]
    return out.transpose(1, 2), lse.reshape(lse.shape[0], lse.shape[1], lse.shape[2])


def cudnn_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    if q.shape[1] == 1 and k.shape[1] == 1:  # cuDNN refuses s_q = s_kv = 1 (a one-token document's block)
        return math_backward(dout, q, k, v, out, lse, causal, scale)
    dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
        _bhsd(dout),
        _bhsd(q),
        _bhsd(k),
        _bhsd(v),
        _bhsd(out),
        lse.unsqueeze(-1).contiguous(),
        _rng_placeholder(q),
        _rng_placeholder(q),
        None,
        None,
        None,
        q.shape[1],
        k.shape[1],
        0.0,
        causal,
        scale=scale,
    )
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# --- FlashAttention-2 (PyTorch's copy) ---------------------------------------------------------------
def flash_forward(q, k, v, causal: bool, scale: float):
    res = aten._scaled_dot_product_flash_attention(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, False, scale=scale)
    return res[0].transpose(1, 2), res[1]


def flash_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        _bhsd(dout),
        _bhsd(q),
        _bhsd(k),
        _bhsd(v),
        _bhsd(out),
        lse.contiguous(),
        None,
        None,
        q.shape[1],
        k.shape[1],
        0.0,
        causal,
        _rng_placeholder(q),
        _rng_placeholder(q),
        scale=scale,
    )
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# --- memory-efficient (CUTLASS) ---------------------------------------------------------------------
def _pad_rows(lse: torch.Tensor, multiple: int = 32) -> torch.Tensor:
    s = lse.shape[-1]
    padded = -(-s // multiple) * multiple
    if padded == s:
        return lse.contiguous()
    return torch.nn.functional.pad(lse, (0, padded - s), value=float("inf")).contiguous()


def efficient_forward(q, k, v, causal: bool, scale: float):
    k, v = _expand_gqa(q, k, v)
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(
        _bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal, scale=scale
    )
    return out.transpose(1, 2), lse[..., : q.shape[1]]


def efficient_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    h_kv = k.shape[2]
    k, v = _expand_gqa(q, k, v)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        _bhsd(dout),
        _bhsd(q),
        _bhsd(k),
        _bhsd(v),
        None,
        _bhsd(out),
        _pad_rows(lse),
        _rng_placeholder(q),
        _rng_placeholder(q),
        0.0,
        [True, True, True, False],
        causal,
        scale=scale,
    )
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    return dq, sum_kv_groups(dk, h_kv), sum_kv_groups(dv, h_kv)


CUDNN = AttnKernel("cudnn", cudnn_forward, cudnn_backward)
FLASH = AttnKernel("flash", flash_forward, flash_backward)
EFFICIENT = AttnKernel("efficient", efficient_forward, efficient_backward, expands_kv=True)
