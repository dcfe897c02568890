"""Kernel ``flex``: PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) on CUDA GPUs.

What it is for: sliding-window (band) blocks and logit soft-capping on a CUDA GPU without flash-attn-4 (cuDNN and the
other SDPA kernels compute neither). FlexAttention takes a block-sparse mask, so a band block costs only the tiles
that touch its band (``skips_band_tiles``), and returns the LSE.

* Layout: our (batch, seq, heads, head_dim) tensors go in as (batch, heads, seq, head_dim) views; GQA is native
  (``enable_gqa=True``: K/V are never repeated).
* Masks: one mask function for every block, ``lo <= i - j <= hi`` on block-local rows (causal: ``lo = 0``; no band:
  ``hi`` past the last key), with ``lo`` / ``hi`` held in tensors so the compiled kernel is reused for every band
  instead of recompiling per value. The block-sparse structure (which 128 x 128 tiles are empty, partial or full) is
  computed from the band arithmetic without evaluating the mask per element (a 128K x 128K mask would not fit), once
  per (shape, band, device) and cached.
* LSE: FlexAttention returns the natural-log LSE (it converts its internal base-2 statistics), float32, (batch,
  heads_q, seq_q): ours as it is.
* Soft-capping: a score modification ``cap * tanh(s / cap)`` of the scaled score (our convention), cap in a tensor.
* Forward: ``torch.compile(flex_attention)``, compiled once per process (FlexAttention's recommended use; shapes
  that change become dynamic after the first recompile).
* Backward: FlexAttention has no entry point that takes the *final* (merged) out and LSE of a query row, which a
  ring schedule's block-wise backward needs. So the backward recomputes the block's own forward ``(out_b, lse_b)``
  under autograd and back-propagates the cotangents that the merge ``out = sum_b exp(lse_b - lse) out_b`` gives it:
  ``dout_b = w dout`` and ``dlse_b = w <dout, out_b - out>`` with ``w = exp(lse_b - lse)`` per row
  (:func:`backward_by_recompute`). Exact; it costs one extra forward per block (forward + backward ~4.5 forward
  passes instead of ~3.5).

CPU: FlexAttention has no backward on CPU (torch raises for inputs that require grad), and compiled CPU
FlexAttention does not return the LSE; ``kernel_works`` refuses ``flex`` there with one line
(:func:`unavailable_reason`). The forward runs eagerly on CPU (it materializes the scores: tests only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from easy_context.kernels.base import AttnKernel, Band

BLOCK = 128  # FlexAttention's default sparse block size (tiles of the block mask)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CACHE_SIZE = 512  # cached block masks (one per distinct block shape and band in a training step)


def flex_import_error() -> str | None:
    """None when ``torch.nn.attention.flex_attention`` has what this kernel calls, else why not."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if not hasattr(BlockMask, "from_kv_blocks"):
        return "this torch's FlexAttention has no BlockMask.from_kv_blocks"
    return None


def unavailable_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why ``flex`` cannot train here (None: it may; a probe call decides). Checks that compile nothing."""
    if device.type != "cuda":
        return (
            f"PyTorch's FlexAttention has no backward on {device.type} (torch {torch.__version__}), so it cannot train "
            "there; it needs a CUDA GPU (on CPU kernel='cpu' or 'auto' computes the same blocks)"
        )
    if dtype not in DTYPES:
        return f"FlexAttention computes bfloat16, float16 and float32, not {dtype}"
    err = flex_import_error()
    if err is not None:
        return f"torch.nn.attention.flex_attention is not usable in torch {torch.__version__} ({err})"
    return None


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def effective_band(sq: int, sk: int, causal: bool, band: Band | None) -> tuple[int, int] | None:
    """(lo, hi) of ``i - j`` that a block-local query row i and key row j may have; None: every pair (no mask)."""
    if band is None and not causal:
        return None
    lo, hi = (int(band[0]), int(band[1])) if band is not None else (-sk, sq)
    if causal:
        lo = max(lo, 0)
    if lo > hi:
        raise ValueError(f"empty band {band} (lo > hi{' after the causal cut' if causal else ''})")
    return lo, hi


def tile_kinds(sq: int, sk: int, lo: int, hi: int, device: torch.device | str, block: int = BLOCK):
    """(partial, full) bool tensors of shape (ceil(sq / block), ceil(sk / block)): which tiles hold some allowed
    (query, key) pairs and which hold only allowed ones, for ``lo <= i - j <= hi``. A tile that reaches past the last
    row or key counts as partial (its padding is masked), as ``create_block_mask`` counts it."""
    qa = torch.arange(0, sq, block, device=device)[:, None]
    ka = torch.arange(0, sk, block, device=device)[None, :]
    qb, kb = (qa + block).clamp(max=sq), (ka + block).clamp(max=sk)
    dmin, dmax = qa - (kb - 1), (qb - 1) - ka  # the range of i - j over the tile's real rows and keys
    touches = (dmax >= lo) & (dmin <= hi)
    inside = (dmin >= lo) & (dmax <= hi) & (qa + block <= sq) & (ka + block <= sk)
    return touches & ~inside, inside


def _ordered(kind: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_blocks (1, 1, nq), indices (1, 1, nq, nk)) int32 of a (nq, nk) tile selection: each row's selected
    tile indices first, ascending (FlexAttention reads the first ``num_blocks`` of each row)."""
    order = torch.sort((~kind).to(torch.int32), dim=1, stable=True).indices
    return kind.sum(1, dtype=torch.int32)[None, None], order.to(torch.int32)[None, None]


def _band_mask_mod(lo: torch.Tensor, hi: torch.Tensor) -> Callable:
    """``lo <= q_idx - kv_idx <= hi`` with the bounds as tensors (one compiled kernel for every band)."""

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= lo) & (d <= hi)

    return mask_mod


@functools.lru_cache(maxsize=CACHE_SIZE)
def block_mask(sq: int, sk: int, lo: int, hi: int, device: torch.device):
    """The FlexAttention ``BlockMask`` of ``lo <= i - j <= hi`` for a (sq, sk) block, shared by batch and heads."""
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = tile_kinds(sq, sk, lo, hi, device)
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    bounds = torch.tensor([lo, hi], device=device)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK,
                                    mask_mod=_band_mask_mod(bounds[0], bounds[1]), seq_lengths=(sq, sk))  # fmt: skip


@functools.lru_cache(maxsize=64)
def _softcap_mod(cap: float, device: torch.device) -> Callable:
    cap_t = torch.tensor(cap, dtype=torch.float32, device=device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap_t * torch.tanh(score / cap_t)

    return score_mod


@functools.cache
def _compiled() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex_fn(device: torch.device) -> Callable:
    """Compiled FlexAttention on GPUs; eager on CPU (forward only there: compiled CPU FlexAttention has no LSE)."""
    if device.type == "cuda":
        return _compiled()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, softcap: float | None,
          band: Band | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """FlexAttention on (b, h, s, d) tensors -> (out (b, h_q, s_q, d), lse (b, h_q, s_q) float32 natural log)."""
    sq, sk = q.shape[2], k.shape[2]
    bounds = effective_band(sq, sk, causal, band)
    mask = None if bounds is None else block_mask(sq, sk, *bounds, q.device)
    kw: dict = dict(score_mod=None if not softcap else _softcap_mod(float(softcap), q.device), block_mask=mask,
                    scale=scale, enable_gqa=q.shape[1] != k.shape[1])  # fmt: skip
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # older torch: the LSE through return_lse
        out, lse = _flex_fn(q.device)(q, k, v, return_lse=True, **kw)
    else:
        out, aux = _flex_fn(q.device)(q, k, v, return_aux=AuxRequest(lse=True), **kw)
        lse = aux.lse
    return out, lse.float()


def flex_forward(q, k, v, causal: bool, scale: float, softcap: float | None = None, band: Band | None = None):
    """(out (b, s_q, h_q, d), lse (b, h_q, s_q) float32) of q (b, s_q, h_q, d) and k, v (b, s_k, h_kv, d)."""
    with torch.no_grad():  # FlexAttention refuses CPU inputs that require grad even under no_grad: detached
        out, lse = _call(*(_bhsd(x.detach()) for x in (q, k, v)), causal, scale, softcap, band)
    return out.transpose(1, 2), lse


def backward_by_recompute(
    forward: Callable, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of one block whose query rows' *final* (merged) result is ``out`` / ``lse``, by recomputing the
    block's own ``forward(q, k, v) -> (out_b, lse_b)`` under autograd.

    The merge gives ``out = sum_b exp(lse_b - lse) out_b`` and ``lse = log sum_b exp(lse_b)``, so this block receives
    ``dout_b = w dout`` and ``dlse_b = w <dout, out_b - out>`` with ``w = exp(lse_b - lse)`` per query row. Shapes:
    q, dout, out (b, s_q, h_q, d); k, v (b, s_k, h_kv, d); lse (b, h_q, s_q) float32; ``forward`` takes and returns
    the same layouts and must be differentiable.
    """
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with torch.enable_grad():
        out_b, lse_b = forward(*leaves)
        w = torch.exp(lse_b.detach().float() - lse.float())  # (b, h, s_q)
        w_rows = w.transpose(1, 2).unsqueeze(-1)  # (b, s_q, h, 1)
        d_out = (dout.float() * w_rows).to(out_b.dtype)
        d_lse = w * (dout.float() * (out_b.detach().float() - out.float())).sum(-1).transpose(1, 2)
        grads = torch.autograd.grad((out_b, lse_b), leaves, (d_out, d_lse.to(lse_b.dtype)))
    return grads[0], grads[1], grads[2]


def flex_backward(dout, q, k, v, out, lse, causal: bool, scale: float, softcap: float | None = None,
                  band: Band | None = None):  # fmt: skip
    """(dq, dk, dv), dk/dv with k's heads, from the final out/LSE (:func:`backward_by_recompute`)."""

    def forward(qq, kk, vv):
        o, s = _call(_bhsd(qq), _bhsd(kk), _bhsd(vv), causal, scale, softcap, band)
        return o.transpose(1, 2), s

    return backward_by_recompute(forward, dout, q, k, v, out, lse)


FLEX = AttnKernel("flex", flex_forward, flex_backward, supports=frozenset({"softcap", "band"}), skips_band_tiles=True)
