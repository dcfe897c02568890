"""Linear + cross-entropy without materialising the ``(N, V)`` logits: chunked over tokens, pure torch.

``chunked_linear_cross_entropy(hidden, weight, targets)`` returns ``(loss_sum, num_valid)``: the SUM of the
per-token cross-entropy over the targets that are not ``ignore_index`` and their count. Sums (not means)
are what the exact global loss (:mod:`easy_context.loss.global_loss`) needs.

Numerics (identical in the chunked and the plain reference): the logits of a chunk are the matmul in the
inputs' dtype (as ``lm_head`` in the model would compute them), upcast to fp32 for the optional soft cap,
the log-sum-exp, the softmax and the target logit. Backward recomputes each chunk's logits from the saved
fp32 log-sum-exp (one float per token); ``d_weight``/``d_bias`` are accumulated in fp32 and returned in
the parameters' dtype. Peak extra memory: a few ``(chunk_size, V)`` fp32 buffers, plus the fp32
``(V, H)`` ``d_weight`` accumulator in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
DEFAULT_CHUNK_SIZE = 1024


def _flatten(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., H), (...) -> (N, H), (N,) with matching N."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} must agree on every dim but the last"
        )
    return hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, softcap: float | None) -> None:
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must be (V, H={hidden.shape[-1]}), got {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype or (bias is not None and bias.dtype != hidden.dtype):
        raise ValueError(f"hidden, weight and bias must share a dtype, got {hidden.dtype} and {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be (V={weight.shape[0]},), got {tuple(bias.shape)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"logit_softcapping must be > 0 or None, got {softcap}")


def _autocast_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Under autocast, cast the inputs (differentiably) to the autocast dtype, as ``lm_head`` would be run.

    The chunked function then runs with autocast off, so its backward recomputes exactly the forward logits.
    """
    device_type = hidden.device.type
    if not torch.is_autocast_enabled(device_type):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(device_type)
    return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def _chunk_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, softcap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 logits (C, V) of a chunk h (C, H); with a soft cap also tanh(x / cap) (C, V) for backward."""
    logits = F.linear(h, weight, bias).float()
    if softcap is None:
        return logits, None
    t = logits.div_(softcap).tanh_()
    return t * softcap, t


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index, chunk_size, softcap):
        n = hidden.shape[0]
        valid = targets != ignore_index
        safe_t = torch.where(valid, targets, torch.zeros_like(targets))
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            logits, _ = _chunk_logits(hidden[s:e], weight, bias, softcap)
            lse[s:e] = torch.logsumexp(logits, dim=-1)
            target_logit = logits.gather(1, safe_t[s:e, None]).squeeze(1)
            loss_sum += torch.where(valid[s:e], lse[s:e] - target_logit, 0.0).sum()
            del logits
        ctx.save_for_backward(hidden, weight, bias, safe_t, valid, lse)
        ctx.chunk_size, ctx.softcap = chunk_size, softcap
        num_valid = valid.sum()
        ctx.mark_non_differentiable(num_valid)
        return loss_sum, num_valid

    @staticmethod
    def backward(ctx, grad_loss, _grad_count):
        hidden, weight, bias, safe_t, valid, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, chunk_size, softcap = hidden.shape[0], ctx.chunk_size, ctx.softcap
        d_hidden = torch.empty_like(hidden) if need_h else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        d_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        grad_loss = grad_loss.float()
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            logits, t = _chunk_logits(hidden[s:e], weight, bias, softcap)
            # d loss_i / d z = softmax(z_i) - onehot(target_i) on valid rows, 0 on ignored rows
            g = logits.sub_(lse[s:e, None]).exp_()
            rows = torch.arange(e - s, device=g.device)
            g[rows, safe_t[s:e]] -= 1.0
            g.mul_((valid[s:e].float() * grad_loss)[:, None])
            if t is not None:  # z = cap * tanh(x / cap)  =>  dz/dx = 1 - tanh^2
                g.mul_(t.square_().neg_().add_(1.0))
                del t
            g_lp = g.to(weight.dtype)  # GEMMs in the inputs' dtype (tensor cores); fp32 only for accumulation
            if need_h:
                d_hidden[s:e] = g_lp @ weight
            if need_w:
                if weight.dtype == torch.float32:
                    d_weight.addmm_(g.t(), hidden[s:e])
                else:  # a bf16/fp16 GEMM (fp32 inside), summed over chunks in fp32: an fp32 GEMM is ~10x slower
                    d_weight.add_(g_lp.t() @ hidden[s:e])
            if need_b:
                d_bias += g.sum(0)
            del g, logits
        d_weight = d_weight.to(weight.dtype) if need_w else None
        d_bias = d_bias.to(bias.dtype) if need_b else None
        return d_hidden, d_weight, d_bias, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and count of ``cross_entropy(hidden @ weight.T + bias, targets)`` over valid targets, chunked.

    Args:
        hidden: (..., H) final hidden states (fp32/bf16/fp16), e.g. (B, S_local, H) of this SP rank.
        weight: (V, H) LM-head weight, same dtype as ``hidden``.
        targets: (...) int64 class ids, ``ignore_index`` for positions without a target. Targets must be
            already shifted (next-token) over the FULL sequence before sharding.
        bias: optional (V,) LM-head bias.
        ignore_index: target value that contributes neither loss nor gradient.
        chunk_size: tokens per chunk; peak extra memory is about ``3 * chunk_size * V * 4`` bytes.
        logit_softcapping: Gemma-2 style cap: logits -> cap * tanh(logits / cap) before the softmax.

    Returns:
        ``(loss_sum, num_valid)``: fp32 scalar (differentiable in hidden, weight, bias) and int64 scalar.
        Both are exactly 0 when no target is valid (and so are the gradients; never NaN).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    _check(hidden, weight, bias, logit_softcapping)
    h, t = _flatten(hidden, targets)
    with torch.autocast(device_type=h.device.type, enabled=False):  # forward and recompute: same dtype
        return _ChunkedLinearCE.apply(h, weight, bias, t, ignore_index, chunk_size, logit_softcapping)


def plain_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
    logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference with the same signature and numerics: materialises the (N, V) fp32 logits.

    ``chunk_size`` is accepted (and ignored) so the implementations are interchangeable.
    Returns ``(loss_sum, num_valid)`` as :func:`chunked_linear_cross_entropy`.
    """
    del chunk_size
    hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    _check(hidden, weight, bias, logit_softcapping)
    h, t = _flatten(hidden, targets)
    logits = F.linear(h, weight, bias).float()
    if logit_softcapping is not None:
        logits = torch.tanh(logits / logit_softcapping) * logit_softcapping
    loss_sum = F.cross_entropy(logits, t, ignore_index=ignore_index, reduction="sum")
    return loss_sum, (t != ignore_index).sum()
