"""The autograd function of every backend: the communicating ones (zigzag ring, DistFlashAttn) and local kernels.

A backend supplies two functions over local shards:
    forward_fn(q, k, v, kernel, scale, causal, group[, documents=...]) -> (out (b, s, h, d), lse (b, h, s) fp32)
    backward_fn(dout, q, k, v, out, lse, kernel, scale, causal, group[, documents=...]) -> (dq, dk, dv)
and :func:`distributed_attention` makes them one differentiable call that also honours
checkpoint-after-attention (the recompute replays the recorded (out, lse) instead of communicating).
``documents`` (document masking, :mod:`easy_context.core.documents`) and ``window`` (a causal sliding window,
:mod:`easy_context.core.windows`) are passed only when given, and the backward and a replay use the same ones as the
forward. ``sinks`` (attention sinks, one logit per head of the local queries) need nothing from the backend: they
merge once into its final (out, lse) here (:func:`~easy_context.core.lse_merge.merge_sinks`), so the backend's backward
sees the final lse (exact), and their gradient comes from (dout, out, lse) (``lse_merge.sink_grad``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from easy_context.core.attn_checkpoint import forward_or_replay
from easy_context.core.documents import Documents
from easy_context.core.lse_merge import merge_sinks, sink_grad
from easy_context.kernels import AttnKernel

ForwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
BackwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _run(tag: str, fwd: ForwardFn, q, k, v, sinks, args: tuple, extra: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's forward (or its replay) with the sinks merged once into its result."""

    def compute():
        out, lse = fwd(q, k, v, *args, **extra)
        return (out, lse) if sinks is None else merge_sinks(out, lse, sinks)

    return forward_or_replay(tag, q, compute, extra.get("documents"))


class DistributedAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, kernel: AttnKernel, scale: float, causal: bool, group, tag: str, fwd, bwd,
                extra: dict):  # fmt: skip
        args = (kernel, scale, causal, group)
        out, lse = _run(tag, fwd, q, k, v, sinks, args, extra)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args, ctx.bwd, ctx.extra = args, bwd, extra
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = ctx.bwd(dout, q, k, v, out, lse, *ctx.args, **ctx.extra)
        dsinks = None if sinks is None or not ctx.needs_input_grad[3] else sink_grad(dout, out, lse, sinks)
        return dq, dk, dv, dsinks, *[None] * 8


def distributed_attention(
    tag: str, fwd: ForwardFn, bwd: BackwardFn, q, k, v, kernel: AttnKernel, scale: float, causal: bool, group,
    documents: Documents | None = None, window: int | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Differentiable ``fwd``/``bwd`` pair; under ``no_grad`` (inference) only the forward runs.
    ``sinks``: (heads,) logits of the local query heads (differentiable), or None."""
    extra = {name: x for name, x in (("documents", documents), ("window", window)) if x is not None}
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, sinks)):
        return DistributedAttnFunc.apply(q, k, v, sinks, kernel, scale, causal, group, tag, fwd, bwd, extra)
    return _run(tag, fwd, q, k, v, sinks, (kernel, scale, causal, group), extra)[0]
