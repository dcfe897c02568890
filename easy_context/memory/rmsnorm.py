"""RMSNorm with a row-chunked backward: no (seq, hidden) fp32 copies kept or created.

transformers' eager RMSNorm (Llama, Mistral, Qwen2, Qwen3) upcasts its input to fp32, so autograd keeps an fp32
copy of the input (2x the bf16 bytes) plus the bf16 normalized tensor, and its backward creates about five fp32
(seq, hidden) temporaries at once. At long context that is the peak of a decoder layer's backward (measured on
an H200 with Llama-3-8B at 64K-256K tokens and reproduced by ``easy_context.plan``): ~10 bf16-sized copies of
the hidden state on top of the checkpoint.

:class:`RMSNormFunction` computes the same values (``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)``)
and saves only the input (usually already alive: the layer input or the residual stream) and the fp32 rstd
(4 bytes per row). Its backward walks the rows in chunks of ``CHUNK_ROWS``, so its fp32 temporaries are
(chunk, hidden), whatever the sequence length. ``weight``'s gradient is accumulated in fp32.

:func:`enable_chunked_rmsnorm` swaps the forward of every RMSNorm module of a model whose math it reproduces: it
checks each norm class once on a probe input against the module's own forward and leaves any other norm (e.g.
Gemma's ``1 + weight``) untouched.
"""

from __future__ import annotations

import types

import torch
from torch import nn

CHUNK_ROWS = 4096


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class RMSNormFunction(torch.autograd.Function):
    """y = weight * (x.float() * rsqrt(mean(x.float()^2, -1) + eps)).to(x.dtype); x (..., hidden), weight (hidden,)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, chunk_rows: int) -> torch.Tensor:
        rows = _rows(x)
        out_dtype = torch.result_type(weight, rows[:0])
        out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        for a in range(0, rows.shape[0], chunk_rows):
            xf = rows[a : a + chunk_rows].float()
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            rstd[a : a + chunk_rows] = r.squeeze(-1)
            out[a : a + chunk_rows] = weight * (xf * r).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.chunk_rows = chunk_rows
        return out.view(*x.shape[:-1], x.shape[-1])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        rows, dy_rows = _rows(x), _rows(dy)
        dx = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        for a in range(0, rows.shape[0], ctx.chunk_rows):
            r = rstd[a : a + ctx.chunk_rows, None]
            x_hat = rows[a : a + ctx.chunk_rows].float() * r
            g = dy_rows[a : a + ctx.chunk_rows]
            if dw is not None:  # d weight = sum over rows of dy * x_hat (x_hat rounded as the forward used it)
                dw += (g.float() * x_hat.to(x.dtype).float()).sum(0)
            if dx is not None:  # through the cast (identity) and the normalisation, in fp32
                gx = (g * weight).float()
                dx[a : a + ctx.chunk_rows] = (r * (gx - x_hat * (gx * x_hat).mean(-1, keepdim=True))).to(x.dtype)
        return (dx.view(x.shape) if dx is not None else None, dw.to(weight.dtype) if dw is not None else None, None,
                None)  # fmt: skip


def _chunked_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, CHUNK_ROWS)


def _reproduces(module: nn.Module) -> bool:
    """Whether :class:`RMSNormFunction` gives this module's own output on a probe input (fp32 and bf16)."""
    h = getattr(module.weight, "ds_shape", module.weight.shape)[-1]  # DeepSpeed ZeRO-3 partitions it to (0,)
    g = torch.Generator().manual_seed(0)
    probe = nn.Parameter(torch.randn(h, generator=g) * 0.1 + 1)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(3, h, generator=g) * 3).to(dtype)
        twin = type(module).__new__(type(module))
        twin.__dict__.update({k: v for k, v in module.__dict__.items() if k != "_parameters"})
        twin._parameters = {"weight": nn.Parameter(probe.detach().to(dtype))}
        with torch.no_grad():
            want = type(module).forward(twin, x)
            got = RMSNormFunction.apply(x, twin.weight, module.variance_epsilon, CHUNK_ROWS)
        if want.dtype != got.dtype or not torch.equal(want, got):
            return False
    return True


def enable_chunked_rmsnorm(model: nn.Module) -> list[str]:
    """Use :class:`RMSNormFunction` in every RMSNorm of ``model`` that it reproduces exactly; returns the names
    of the patched modules (the others keep their forward). Parameters and state dicts are unchanged."""
    verdicts: dict[type, bool] = {}
    patched = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not hasattr(module, "variance_epsilon") or not isinstance(weight, nn.Parameter) or weight.dim() != 1:
            continue
        cls = type(module)
        if cls not in verdicts:
            verdicts[cls] = _reproduces(module)
        if verdicts[cls]:
            module.forward = types.MethodType(_chunked_forward, module)
            patched.append(name)
    return patched
