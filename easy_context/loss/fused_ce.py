"""``linear_cross_entropy(..., impl=...)``: one signature over the linear + cross-entropy implementations.

* ``chunked`` (default): :func:`~easy_context.loss.chunked_ce.chunked_linear_cross_entropy`, pure torch,
  runs anywhere, peak extra memory O(chunk_size x V).
* ``plain``: materialises the (N, V) logits; the reference.
* ``liger``: Liger-Kernel's fused linear cross-entropy (Triton, CUDA only; ``pip install liger-kernel``).
* ``cce``: Apple's Cut Cross-Entropy (Triton, CUDA only; ``pip install cut-cross-entropy``).

Every implementation returns ``(loss_sum, num_valid)``: the SUM of the per-token losses over the targets
that are not ``ignore_index`` and their count (int64), the inputs of :func:`global_mean_loss`.
``--loss auto`` (:mod:`easy_context.loss.select`) picks ``liger`` on a CUDA device with liger-kernel installed,
``chunked`` otherwise.

The ``liger`` wrapper's arguments are tested on CPU against a stand-in of liger's functional and its kernels on
the GPU (bench/loss_kernels.py); ``cce`` only calls that package's documented API with ``reduction="sum"``.
"""

from __future__ import annotations

import importlib

import torch

from easy_context.loss.chunked_ce import (
    DEFAULT_CHUNK_SIZE,
    IGNORE_INDEX,
    _autocast_inputs,
    _check,
    _flatten,
    chunked_linear_cross_entropy,
    plain_linear_cross_entropy,
)

LCE_IMPLS = ("chunked", "plain", "liger", "cce")
LIGER_DEVICE_TYPES = ("cuda",)  # Liger's Triton kernels (ROCm GPUs are "cuda" devices in torch too)


def _import(module: str, attr: str, pip_name: str, impl: str):
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ImportError(
            f"linear_cross_entropy(impl={impl!r}) needs the {pip_name!r} package (pip install {pip_name}), "
            f"which could not be imported ({exc}); impl='chunked' runs without it"
        ) from exc


def _count(targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return (targets != ignore_index).sum()


def liger_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
    logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger-Kernel's fused linear CE (CUDA) as ``(loss_sum, num_valid)``, the math of the chunked loss.

    Same contract as :func:`~easy_context.loss.chunked_ce.chunked_linear_cross_entropy`: ``reduction="sum"``
    over the targets that are not ``ignore_index`` (exactly 0, with zero gradients, when none is valid: Liger
    skips ignored rows and only a "mean" divides by the count); under autocast the inputs are cast as
    ``lm_head`` would be run; the logits are the matmul in the inputs' dtype, the softmax and the soft cap fp32
    (inside Liger's kernel); ``d_weight``/``d_bias`` are accumulated over Liger's chunks in fp32
    (``accum_dtype=torch.float32``; Liger's default sums them in the parameters' dtype) and returned in that
    dtype. ``chunk_size`` is ignored (Liger sizes its chunks from V / H).
    """
    del chunk_size
    fn = _import("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy", "liger-kernel", "liger")
    hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    _check(hidden, weight, bias, logit_softcapping)
    if hidden.device.type not in LIGER_DEVICE_TYPES:
        raise ValueError(
            f"loss 'liger' runs on CUDA GPUs only (hidden is on {hidden.device.type}); use impl 'chunked' (or 'auto')"
        )
    h, t = _flatten(hidden, targets)
    params_need_grad = weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and params_need_grad and not h.requires_grad:
        h = h.detach().requires_grad_()  # Liger computes d_weight/d_bias only when its input needs a gradient
    with torch.autocast(device_type=h.device.type, enabled=False):  # the inputs are already in the autocast dtype
        loss_sum = fn(h, weight, t, bias=bias, ignore_index=ignore_index, reduction="sum", softcap=logit_softcapping,
                      accum_dtype=torch.float32)  # fmt: skip
    return loss_sum.float(), _count(t, ignore_index)


def cce_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
    logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut Cross-Entropy (CUDA). ``chunk_size`` is ignored. Targets are used as given (no shift).

    Gradient filtering is off (``filter_eps=None``) so the result is exact, not CCE's approximation.
    """
    del chunk_size
    if bias is not None:
        raise NotImplementedError("loss 'cce' (cut-cross-entropy) has no LM-head bias; use --loss chunked")
    fn = _import("cut_cross_entropy", "linear_cross_entropy", "cut-cross-entropy", "cce")
    h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    loss_sum = fn(h, weight, t, ignore_index=ignore_index, softcap=logit_softcapping, reduction="sum", filter_eps=None)
    return loss_sum.float(), _count(t, ignore_index)


_IMPLS = {
    "chunked": chunked_linear_cross_entropy,
    "plain": plain_linear_cross_entropy,
    "liger": liger_linear_cross_entropy,
    "cce": cce_linear_cross_entropy,
}


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    impl: str = "chunked",
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and count of the cross-entropy of ``hidden @ weight.T + bias`` against ``targets``.

    Args:
        hidden: (..., H) final hidden states; weight: (V, H); targets: (...) int64 (already shifted);
        bias: optional (V,).
        impl: one of ``LCE_IMPLS`` (see the module docstring).
        ignore_index: targets with this value add neither loss nor gradient.
        chunk_size: tokens per chunk (``chunked`` only).
        logit_softcapping: optional Gemma-2 style tanh cap of the logits.

    Returns:
        ``(loss_sum, num_valid)``: fp32 scalar sum over valid targets, int64 scalar count.
    """
    if impl not in _IMPLS:
        raise ValueError(f"unknown linear_cross_entropy impl {impl!r}; choose one of {LCE_IMPLS}")
    return _IMPLS[impl](
        hidden,
        weight,
        targets,
        bias,
        ignore_index=ignore_index,
        chunk_size=chunk_size,
        logit_softcapping=logit_softcapping,
    )
