"""The autograd function of every backend: the communicating ones (zigzag ring, DistFlashAttn) and local kernels.

A backend supplies two functions over local shards:
    forward_fn(q, k, v, kernel, scale, causal, group) -> (out (b, s, h, d), lse (b, h, s) fp32)
    backward_fn(dout, q, k, v, out, lse, kernel, scale, causal, group) -> (dq, dk, dv)
and :func:`distributed_attention` makes them one differentiable call that also honours
checkpoint-after-attention (the recompute replays the recorded (out, lse) instead of communicating).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .attn_checkpoint import forward_or_replay
from .kernels import AttnKernel

ForwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
BackwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class DistributedAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kernel: AttnKernel, scale: float, causal: bool, group, tag: str, fwd, bwd):
        out, lse = forward_or_replay(tag, q, lambda: fwd(q, k, v, kernel, scale, causal, group))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args, ctx.bwd = (kernel, scale, causal, group), bwd
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.bwd(dout.contiguous(), q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None


def distributed_attention(
    tag: str, fwd: ForwardFn, bwd: BackwardFn, q, k, v, kernel: AttnKernel, scale: float, causal: bool, group
) -> torch.Tensor:
    """Differentiable ``fwd``/``bwd`` pair; under ``no_grad`` (inference) only the forward runs."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return DistributedAttnFunc.apply(q, k, v, kernel, scale, causal, group, tag, fwd, bwd)
    return forward_or_replay(tag, q, lambda: fwd(q, k, v, kernel, scale, causal, group))[0]
