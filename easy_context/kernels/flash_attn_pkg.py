"""Kernel from the ``flash-attn`` package (FlashAttention-2), used when it is importable.

Forward goes through the public ``flash_attn_func(..., return_attn_probs=True)`` (returns the LSE);
backward through ``flash_attn_interface._flash_attn_backward``, whose arguments changed between releases,
so they are passed by name after reading its signature once.
"""

from __future__ import annotations

import functools
import inspect

import torch

from easy_context.kernels.base import AttnKernel


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _backward_params() -> tuple[str, ...]:
    from flash_attn import flash_attn_interface

    return tuple(inspect.signature(flash_attn_interface._flash_attn_backward).parameters)


def fa_forward(q, k, v, causal: bool, scale: float):
    from flash_attn import flash_attn_func

    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, 0.0, softmax_scale=scale, causal=causal, return_attn_probs=True)
    return out, lse[..., : q.shape[1]]


def fa_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    from flash_attn import flash_attn_interface

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    values = {
        "dout": dout.contiguous(),
        "q": q,
        "k": k,
        "v": v,
        "out": out.contiguous(),
        "softmax_lse": lse.contiguous(),
        "dq": dq,
        "dk": dk,
        "dv": dv,
        "dropout_p": 0.0,
        "softmax_scale": scale,
        "causal": causal,
        "window_size": (-1, -1),
        "window_size_left": -1,
        "window_size_right": -1,
        "softcap": 0.0,
        "alibi_slopes": None,
        "deterministic": False,
        "rng_state": None,
    }
    params = _backward_params()
    missing = [p for p in params if p not in values]
    if missing:
        raise RuntimeError(f"unsupported flash-attn version: _flash_attn_backward wants {missing}")
    flash_attn_interface._flash_attn_backward(**{p: values[p] for p in params})
    return dq, dk, dv


FLASH_ATTN = AttnKernel("flash_attn", fa_forward, fa_backward)
