"""Single-device attention through a local kernel, as an autograd function (data parallel, Ulysses)."""

from __future__ import annotations

import torch

from .attn_checkpoint import forward_or_replay
from .kernels import AttnKernel


class LocalAttention(torch.autograd.Function):
    """out = attention(q, k, v) with layouts (b, s, h, d); k/v may have fewer heads (GQA)."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: AttnKernel, scale: float, causal: bool):
        # inside a checkpoint_after_attention layer the recompute replays the recorded (out, lse)
        out, lse = forward_or_replay("local", q, lambda: kernel.forward(q, k, v, causal, scale))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.scale, ctx.causal = kernel, scale, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def local_attention(q, k, v, kernel: AttnKernel, scale: float, causal: bool, group=None) -> torch.Tensor:
    """Attention of the whole (local) sequence; ``group`` is ignored."""
    return LocalAttention.apply(q, k, v, kernel, scale, causal)
