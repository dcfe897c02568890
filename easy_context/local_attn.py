"""Single-device attention through a local kernel (data parallel, Ulysses' inner call), on the shared autograd
function of :mod:`easy_context.distributed_attn` (one save-(out, lse) backward, one checkpoint replay)."""

from __future__ import annotations

import torch

from .distributed_attn import distributed_attention
from .kernels import AttnKernel


def _kernel_forward(q, k, v, kernel: AttnKernel, scale: float, causal: bool, group):
    return kernel.forward(q, k, v, causal, scale)


def _kernel_backward(dout, q, k, v, out, lse, kernel: AttnKernel, scale: float, causal: bool, group):
    return kernel.backward(dout, q, k, v, out, lse, causal, scale)


def local_attention(q, k, v, kernel: AttnKernel, scale: float, causal: bool, group=None) -> torch.Tensor:
    """Attention of the whole (local) sequence, (b, s, h, d) layouts, k/v may have fewer heads; ``group`` is
    ignored."""
    return distributed_attention("local", _kernel_forward, _kernel_backward, q, k, v, kernel, scale, causal, group)
