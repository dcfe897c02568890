"""Kernel ``fa4``: FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL) on Hopper / Blackwell GPUs.

Read from flash-attn-4 4.0.0b36 (``flash_attn/cute/interface.py``):

* forward: the public ``flash_attn_func(q, k, v, softmax_scale=, causal=, window_size=(left, right), softcap=,
  return_lse=True) -> (out, lse)``; q/k/v (b, s, h, d) with native GQA; ``lse`` is (b, h_q, s_q) float32 and
  natural-log (``softmax.py`` finalizes ``(row_max * scale * log2 e + log2 row_sum) * ln 2``) -- :func:`to_natural_lse`.
* backward: ``interface._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale, causal, softcap,
  window_size_left, window_size_right, ...) -> (dq, dk, dv)`` from our saved (final, merged) out and LSE, dk/dv with
  k's heads. Passed by name after checking its signature once (it is internal and may change).
* soft-capping: ``cap * tanh(s * scale / cap)`` before the softmax (``utils.create_softcap_scoremod``, the scale is
  applied first), the LSE of the capped scores: our ``"softcap"`` convention.
* windows: query row i sees key row j iff ``i + (s_k - s_q) - left <= j <= i + (s_k - s_q) + right`` (bottom-right
  aligned, ``mask.py`` / ``block_info.py``); ``causal`` sets ``right = 0``. The window sizes are runtime values (the
  compile key only holds whether each side is set), so every band block of one shape reuses one compiled kernel.
  :func:`band_window` maps our block-local band exactly, rectangular blocks included.
* head_dim: 8..256 on sm90, 8..128 or 256 on sm100 (multiples of 8 for 16-bit types); fp16 / bf16 only.
* layouts: every tensor goes in contiguous. transformers hands attention (b, h, s, d) tensors that easy_context sees
  as transposed (b, s, h, d) views (head stride s * d); flash-attn-4 kernels have read such views as if contiguous
  (flash-attention issues 2665, 2886: head_dim 256), silently wrong. The copy costs one pass over q/k/v.

Each new configuration JIT-compiles on its first call (seconds to tens of seconds): the first call of every
(direction, dtype, head_dim, GQA ratio, causal, softcap, band) prints one line saying so, and
:data:`COMPILE_SECONDS` keeps its first-call time. flash-attn-4 keeps compiled kernels on disk across processes when
``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` is set before it is imported (docs/kernels.md).

Calls past 2^31 elements are split over heads like every kernel's (:func:`easy_context.kernels.base.head_groups`).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import time

import torch

from easy_context.kernels.base import AttnKernel, Band

INSTALL = "`pip install flash-attn-4` (or `pip install easy_context[gpu]`)"
CAPABILITIES = (9, 10)  # compute capability majors: Hopper (sm90), Blackwell datacenter (sm100)
DTYPES = (torch.bfloat16, torch.float16)
LSE_IS_LOG2 = False  # flash-attn-4 writes the natural-log LSE (softmax.py: ... * ln 2)
COMPILE_SECONDS: dict[tuple, float] = {}  # first-call seconds (compile + run) per configuration, this process

_BWD_ARGS = ("q", "k", "v", "out", "dout", "lse", "softmax_scale", "causal", "softcap", "window_size_left",
             "window_size_right")  # fmt: skip


@functools.cache
def fa4_import_error() -> str | None:
    """None when FlashAttention-4 is importable with the API this adapter calls, else why not.

    The flash-attn (FA2) package and flash-attn-4 both install under ``flash_attn``: FA4 ships only
    ``flash_attn/cute`` (``flash_attn`` is then a namespace package), FA2 ships ``flash_attn/__init__.py``. This
    checks ``flash_attn.cute`` itself and the signatures used, so an FA2-only install never counts as FA4.
    """
    try:
        from flash_attn.cute import flash_attn_func, interface
    except Exception as exc:  # ImportError, or the CuTe DSL failing to load
        return f"{type(exc).__name__}: {exc}"
    fwd = inspect.signature(flash_attn_func).parameters
    bwd = inspect.signature(getattr(interface, "_flash_attn_bwd", lambda: None)).parameters
    missing = [p for p in ("softmax_scale", "causal", "window_size", "softcap", "return_lse") if p not in fwd]
    missing += [f"_flash_attn_bwd({p}=)" for p in _BWD_ARGS if p not in bwd]
    if missing:
        return f"unsupported flash-attn-4 version (missing {', '.join(missing)}); this adapter was written for 4.0.0b36"
    return None


def fa4_available() -> bool:
    return fa4_import_error() is None


def head_dim_supported(capability_major: int, head_dim: int) -> bool:
    """flash-attn-4's limits for q/k/v of one head_dim (``interface._validate_head_dims``, 16-bit types)."""
    if head_dim % 8:
        return False
    if capability_major == 9:
        return 8 <= head_dim <= 256
    return 8 <= head_dim <= 128 or head_dim == 256


def unavailable_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why ``fa4`` cannot run for this device, dtype and head_dim (None: it may; a probe call decides).
    Checks that compile nothing, cheapest first (no import of the package for a CPU or fp32 call)."""
    need = "it needs a CUDA GPU of compute capability 9.x or 10.x (Hopper, Blackwell) and the flash-attn-4 package"
    if device.type != "cuda":
        return f"{need}; this is {device.type}"
    if dtype not in DTYPES:
        return f"flash-attn-4 computes bfloat16 and float16 only, not {dtype}"
    err = fa4_import_error()
    if err is not None:
        return f"flash_attn.cute (FlashAttention-4) is not importable ({err}); install it with {INSTALL}"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in CAPABILITIES:
        return f"{need}; this GPU is compute capability {major}.{minor}"
    if not head_dim_supported(major, head_dim):
        limit = "8-256" if major == 9 else "8-128 or 256"
        return f"flash-attn-4 on compute capability {major}.x takes head_dim {limit} in multiples of 8, not {head_dim}"
    return None


def to_natural_lse(lse: torch.Tensor, batch: int, heads: int, seq: int, log2: bool = LSE_IS_LOG2) -> torch.Tensor:
    """flash-attn-4's LSE as ours: (batch, heads_q, seq_q) float32, natural log (``log2``: it was base 2)."""
    if tuple(lse.shape) != (batch, heads, seq):
        raise RuntimeError(
            f"flash-attn-4 returned an LSE of shape {tuple(lse.shape)}, expected {(batch, heads, seq)} "
            "(batch, heads, seq): an unsupported flash-attn-4 version"
        )
    lse = lse.float()
    return lse * math.log(2.0) if log2 else lse


def band_window(band: Band | None, seq_q: int, seq_k: int, causal: bool) -> tuple[bool, int | None, int | None]:
    """(causal, window_size_left, window_size_right) for flash-attn-4 computing the block-local ``band``.

    Ours: row i sees key j iff ``lo <= i - j <= hi`` (and ``i >= j`` when causal). flash-attn-4's window is
    bottom-right aligned: ``i + off - left <= j <= i + off + right`` with ``off = seq_k - seq_q``, so
    ``left = hi + off`` and ``right = -lo - off`` (either may be negative; both cannot, as lo <= hi). A causal band
    is the band with ``lo >= 0``. Both sides always set: one compiled kernel for all band blocks.
    """
    if band is None:
        return causal, None, None
    lo, hi = int(band[0]), int(band[1])
    if causal:
        lo = max(lo, 0)
    if lo > hi:
        raise ValueError(f"empty band {band} (lo > hi{' after the causal cut' if causal else ''})")
    off = seq_k - seq_q
    return False, hi + off, -lo - off


def _config(direction: str, q, k, fa_causal: bool, softcap: float | None, band: Band | None) -> tuple:
    """What flash-attn-4 compiles a kernel for (roughly: it also specializes on a few size classes)."""
    return (direction, str(q.dtype).removeprefix("torch."), q.shape[-1], q.shape[2] // k.shape[2], bool(fa_causal),
            softcap, band is not None)  # fmt: skip


def _is_rank0() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _describe(cfg: tuple) -> str:
    direction, dtype, d, rep, causal, softcap, band = cfg
    parts = [dtype, f"head_dim {d}", "causal" if causal else "non-causal", f"GQA {rep}:1" if rep > 1 else "MHA"]
    parts += [f"softcap {softcap:g}"] if softcap else []
    parts += ["band"] if band else []
    return f"{direction} kernel ({', '.join(parts)})"


def _timed_first_call(cfg: tuple, fn, *args, **kw):
    """Run ``fn``; the first time of ``cfg`` in this process, say that it compiles and record how long it took."""
    if cfg in COMPILE_SECONDS:
        return fn(*args, **kw)
    if _is_rank0():
        print(f"easy_context: flash-attn-4 compiles its {_describe(cfg)} on first use (once per process; can take "
              "tens of seconds)", file=sys.stderr, flush=True)  # fmt: skip
    start = time.perf_counter()
    result = fn(*args, **kw)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    COMPILE_SECONDS[cfg] = time.perf_counter() - start
    return result


def _check_dtype(q: torch.Tensor) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"attention kernel 'fa4' computes bfloat16 and float16 only, got {q.dtype}")


def fa4_forward(q, k, v, causal: bool, scale: float, softcap: float | None = None, band: Band | None = None):
    _check_dtype(q)
    from flash_attn.cute import flash_attn_func

    b, sq, hq, _ = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    fa_causal, left, right = band_window(band, sq, k.shape[1], causal)
    kw = dict(softmax_scale=scale, causal=fa_causal, window_size=(left, right), softcap=softcap or 0.0, return_lse=True)
    with torch.no_grad():
        out, lse = _timed_first_call(_config("forward", q, k, fa_causal, softcap, band), flash_attn_func, q, k, v, **kw)
    return out, to_natural_lse(lse, b, hq, sq)


def fa4_backward(dout, q, k, v, out, lse, causal: bool, scale: float, softcap: float | None = None,
                 band: Band | None = None):  # fmt: skip
    _check_dtype(q)
    from flash_attn.cute import interface

    fa_causal, left, right = band_window(band, q.shape[1], k.shape[1], causal)
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    kw = dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse.float().contiguous(), softmax_scale=scale, causal=fa_causal,
              softcap=softcap or 0.0, window_size_left=left, window_size_right=right)  # fmt: skip
    cfg = _config("backward", q, k, fa_causal, softcap, band)
    grads = _timed_first_call(cfg, interface._flash_attn_bwd, **kw)
    return grads[0], grads[1], grads[2]


FA4 = AttnKernel("fa4", fa4_forward, fa4_backward, supports=frozenset({"softcap", "band"}), skips_band_tiles=True)
