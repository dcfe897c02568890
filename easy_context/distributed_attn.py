"""The autograd function of every backend: the communicating ones (zigzag ring, DistFlashAttn) and local kernels.

A backend supplies two functions over local shards:
    forward_fn(q, k, v, kernel, scale, causal, group[, documents=...]) -> (out (b, s, h, d), lse (b, h, s) fp32)
    backward_fn(dout, q, k, v, out, lse, kernel, scale, causal, group[, documents=...]) -> (dq, dk, dv)
and :func:`distributed_attention` makes them one differentiable call that also honours
checkpoint-after-attention (the recompute replays the recorded (out, lse) instead of communicating).
``documents`` (document masking, :mod:`easy_context.documents`) is passed only when given, and the backward and a
replay use the same documents as the forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .attn_checkpoint import forward_or_replay
from .documents import Documents
from .kernels import AttnKernel

ForwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
BackwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class DistributedAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kernel: AttnKernel, scale: float, causal: bool, group, tag: str, fwd, bwd, documents):
        extra = {} if documents is None else {"documents": documents}
        out, lse = forward_or_replay(tag, q, lambda: fwd(q, k, v, kernel, scale, causal, group, **extra), documents)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args, ctx.bwd, ctx.extra = (kernel, scale, causal, group), bwd, extra
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.bwd(dout.contiguous(), q, k, v, out, lse, *ctx.args, **ctx.extra)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def distributed_attention(
    tag: str, fwd: ForwardFn, bwd: BackwardFn, q, k, v, kernel: AttnKernel, scale: float, causal: bool, group,
    documents: Documents | None = None,
) -> torch.Tensor:  # fmt: skip
    """Differentiable ``fwd``/``bwd`` pair; under ``no_grad`` (inference) only the forward runs."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return DistributedAttnFunc.apply(q, k, v, kernel, scale, causal, group, tag, fwd, bwd, documents)
    extra = {} if documents is None else {"documents": documents}
    return forward_or_replay(tag, q, lambda: fwd(q, k, v, kernel, scale, causal, group, **extra), documents)[0]
