"""RMSNorm with a row-chunked backward: no (seq, hidden) fp32 copies kept or created.

transformers' eager RMSNorms upcast their input to fp32, so autograd keeps an fp32 copy of the input (2x the bf16
bytes) plus the normalized tensor (bf16 for Llama, fp32 for Gemma), and their backward creates about five fp32
(seq, hidden) temporaries at once. At long context that is the peak of a decoder layer's backward (measured on an
H200 with Llama-3-8B at 64K-256K tokens and reproduced by ``easy_context.plan``): ~10 bf16-sized copies of the
hidden state on top of the checkpoint. Gemma 2/3 have four such norms per layer plus the per-head q and k norms.

:class:`RMSNormFunction` computes the same values as the module it replaces, in one of two :class:`NormStyle` s:

- ``LLAMA`` (Llama, Mistral, Qwen2/3, ...): ``weight * (x.float() * rstd).to(x.dtype)``;
- ``GEMMA`` (Gemma 1/2/3, the product in fp32): ``(x.float() * rstd * (1 + weight.float())).to(x.dtype)``;

and saves only the input (usually already alive: the layer input, the residual stream, a projection's output) and
the fp32 rstd (4 bytes per row). Forward and backward walk the rows in chunks of ``CHUNK_ROWS``, so their fp32
temporaries are (chunk, hidden), whatever the sequence length; ``weight``'s gradient is accumulated in fp32. An
input whose rows are not contiguous (Gemma's q/k norms see the (batch, heads, seq, head_dim) transpose of the
projection) is walked in its memory order, and the output keeps that layout, as the eager norm's does.

:func:`enable_chunked_rmsnorm` swaps the forward of every RMSNorm module of a model whose math one style
reproduces bit for bit: it checks each norm class once on a probe input against the module's own forward and leaves
any other norm untouched (and names it).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn

CHUNK_ROWS = 4096


@dataclass(frozen=True)
class NormStyle:
    """How the weight scales the normalized rows: ``offset + weight``, in fp32 before the cast (``fp32_scale``) or
    after the cast to the input's dtype."""

    name: str
    offset: float
    fp32_scale: bool


LLAMA = NormStyle("llama", 0.0, False)
GEMMA = NormStyle("gemma", 1.0, True)
STYLES = (LLAMA, GEMMA)


def _memory_order(x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """(a contiguous view or copy of ``x`` with its dims in memory order and the last dim kept last, that order)."""
    order = sorted(range(x.dim() - 1), key=lambda d: -x.stride(d)) + [x.dim() - 1]
    view = x.permute(order)
    return (view if view.is_contiguous() else view.contiguous()), order


def _in_order(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    """``t`` permuted to ``order`` and made contiguous (a view when it already lies that way)."""
    view = t.permute(order)
    return view if view.is_contiguous() else view.contiguous()


def _unorder(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    """The inverse of ``permute(order)``."""
    return t.permute([order.index(d) for d in range(len(order))])


class RMSNormFunction(torch.autograd.Function):
    """``style``'s RMSNorm of x (..., hidden) with weight (hidden,), the rows in chunks; saves x and the fp32 rstd."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, chunk_rows: int,
                style: NormStyle = LLAMA) -> torch.Tensor:  # fmt: skip
        xo, order = _memory_order(x)
        rows = xo.view(-1, x.shape[-1])
        out_dtype = x.dtype if style.fp32_scale else torch.result_type(weight, rows[:0])
        out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        scale = style.offset + weight.float() if style.fp32_scale else weight
        for a in range(0, rows.shape[0], chunk_rows):
            xf = rows[a : a + chunk_rows].float()
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            rstd[a : a + chunk_rows] = r.squeeze(-1)
            if style.fp32_scale:
                out[a : a + chunk_rows] = (xf * r * scale).to(x.dtype)
            else:
                out[a : a + chunk_rows] = scale * (xf * r).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.chunk_rows, ctx.style, ctx.order = chunk_rows, style, order
        return _unorder(out.view(xo.shape), order)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        style, order, n = ctx.style, ctx.order, ctx.chunk_rows
        xo = _in_order(x, order)
        rows, dy_rows = xo.view(-1, x.shape[-1]), _in_order(dy, order).view(-1, x.shape[-1])
        dx = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        scale = style.offset + weight.float() if style.fp32_scale else weight
        for a in range(0, rows.shape[0], n):
            r = rstd[a : a + n, None]
            x_hat = rows[a : a + n].float() * r
            g = dy_rows[a : a + n]
            if dw is not None:  # d weight = sum over rows of dy * x_hat (as the forward multiplied them)
                dw += (g.float() * (x_hat if style.fp32_scale else x_hat.to(x.dtype).float())).sum(0)
            if dx is not None:  # through the cast (identity) and the normalisation, in fp32
                gx = g.float() * scale if style.fp32_scale else (g * scale).float()
                dx[a : a + n] = (r * (gx - x_hat * (gx * x_hat).mean(-1, keepdim=True))).to(x.dtype)
        dx = _unorder(dx.view(xo.shape), order) if dx is not None else None
        grads = (dx, (dw.to(weight.dtype) if dw is not None else None), None, None, None)
        return grads[: len(ctx.needs_input_grad)]  # ``style`` may have been left to its default


def _eps(module: nn.Module) -> float | None:
    """The module's epsilon (Llama-family ``variance_epsilon``, Gemma-family ``eps``), None when it has neither."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return eps if isinstance(eps, float) else None


def _chunked_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return RMSNormFunction.apply(hidden_states, self.weight, _eps(self), CHUNK_ROWS, self._chunked_norm_style)


def _reproducing_style(module: nn.Module) -> NormStyle | None:
    """The style whose :class:`RMSNormFunction` gives this module's own output bit for bit on a probe input (fp32
    and bf16), None when none does (a LayerNorm, a norm with a bias, other math)."""
    h = getattr(module.weight, "ds_shape", module.weight.shape)[-1]  # DeepSpeed ZeRO-3 partitions it to (0,)
    for style in STYLES:
        g = torch.Generator().manual_seed(0)
        probe = torch.randn(h, generator=g) * 0.1 + 1
        ok = True
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(3, h, generator=g) * 3).to(dtype)
            twin = type(module).__new__(type(module))
            twin.__dict__.update({k: v for k, v in module.__dict__.items() if k != "_parameters"})
            twin._parameters = {"weight": nn.Parameter(probe.to(dtype))}
            try:
                with torch.no_grad():
                    want = type(module).forward(twin, x)
                    got = RMSNormFunction.apply(x, twin.weight, _eps(module), CHUNK_ROWS, style)
            except (AttributeError, TypeError, RuntimeError):  # a forward that needs what the twin lacks
                return None
            ok = ok and isinstance(want, torch.Tensor) and want.dtype == got.dtype and torch.equal(want, got)
        if ok:
            return style
    return None


def enable_chunked_rmsnorm(model: nn.Module) -> list[str]:
    """Use :class:`RMSNormFunction` in every RMSNorm of ``model`` that one :class:`NormStyle` reproduces exactly;
    returns the names of the patched modules (the others keep their forward: :func:`unpatched_norms` names them).
    Parameters and state dicts are unchanged."""
    verdicts: dict[type, NormStyle | None] = {}
    patched = []
    for name, module in _norm_candidates(model):
        cls = type(module)
        if cls not in verdicts:
            verdicts[cls] = _reproducing_style(module)
        if verdicts[cls] is not None:
            module._chunked_norm_style = verdicts[cls]
            module.forward = types.MethodType(_chunked_forward, module)
            patched.append(name)
    return patched


def _norm_candidates(model: nn.Module):
    """(name, module) of every module shaped like an RMSNorm: a float epsilon and a 1-D weight parameter."""
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if _eps(module) is not None and isinstance(weight, nn.Parameter) and weight.dim() == 1:
            yield name, module


def unpatched_norms(model: nn.Module) -> dict[str, int]:
    """Class name -> count of the norm-shaped modules that kept their own forward (after
    :func:`enable_chunked_rmsnorm`): what ``--chunked-rmsnorm`` did not cover."""
    left: dict[str, int] = {}
    for _, module in _norm_candidates(model):
        if not hasattr(module, "_chunked_norm_style"):
            left[type(module).__name__] = left.get(type(module).__name__, 0) + 1
    return left


def unpatched_note(model: nn.Module) -> str | None:
    """The one line ``--chunked-rmsnorm`` prints when some norms of ``model`` kept their own forward (their memory
    is not saved), None when every norm-shaped module is chunked."""
    left = unpatched_norms(model)
    if not left:
        return None
    kept = ", ".join(f"{name} x{count}" for name, count in left.items())
    return f"note: --chunked-rmsnorm: {kept} kept transformers' forward (math neither norm style reproduces)"
