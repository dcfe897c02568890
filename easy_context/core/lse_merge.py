"""The one log-sum-exp merge of partial attention results, in float32.

Attention over the union of two key sets, from the results over each:
    lse = logaddexp(lse_a, lse_b)
    out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)
Accumulating in fp32 keeps ring results independent of the ring size (bf16 accumulation is the known
source of error growing with the number of ring steps).
"""

from __future__ import annotations

import functools
import warnings

import torch

_FUSED_BROKEN = False


@functools.lru_cache(maxsize=1)
def _fused_merge():
    """The Triton merge when Triton is importable (GPU builds of torch), else None."""
    try:
        from easy_context.core.lse_merge_triton import merge_into_triton_
    except Exception:
        return None
    return merge_into_triton_


def merge_into_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge a block result into fp32 accumulators, in place (views of larger buffers are fine).

    acc_out: (batch, seq, heads, dim) float32      out: same shape, any float dtype
    acc_lse: (batch, heads, seq) float32            lse: same shape, float32
    """
    global _FUSED_BROKEN
    fused = _fused_merge() if acc_out.is_cuda and not _FUSED_BROKEN else None
    if fused is not None and acc_out.stride(-1) == 1 and out.stride(-1) == 1:
        try:
            fused(acc_out, acc_lse, out, lse)
            return
        except Exception as exc:  # e.g. Triton cannot compile for this GPU: the eager merge is exact too
            _FUSED_BROKEN = True
            warnings.warn(f"fused Triton LSE merge failed ({exc}); using the eager merge", stacklevel=2)
    merge_eager_(acc_out, acc_lse, out, lse)


def merge_eager_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Eager PyTorch version of :func:`merge_into_` (CPU, and CUDA without Triton)."""
    new_lse = torch.logaddexp(acc_lse, lse)
    w_acc = torch.exp(acc_lse - new_lse).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
    acc_out.mul_(w_acc).addcmul_(out, w_new)  # no fp32 copy of ``out``: two passes over acc_out
    acc_lse.copy_(new_lse)


def merge_safe_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """:func:`merge_into_` where rows of either side may have no keys (lse -inf, out 0): such a row takes the other
    side's values, and a row without keys on both sides stays (0, -inf) instead of becoming NaN
    (exp(-inf - -inf)). Used for partial results under document masking."""
    new_lse = torch.logaddexp(acc_lse, lse)
    ref = torch.where(torch.isneginf(new_lse), torch.zeros_like(new_lse), new_lse)
    w_acc = torch.exp(acc_lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    acc_out.mul_(w_acc).addcmul_(out, w_new)
    acc_lse.copy_(new_lse)


def merge_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention sinks (gpt-oss): one learnable logit per head in every row's softmax denominator, merged once.

    The sink is a virtual key block of value zero and LSE ``sinks[h]``, so it enters through the one merge:
    ``lse' = logaddexp(lse, sink)``, ``out' = out * exp(lse - lse')``. out (batch, seq, heads, dim), lse
    (batch, heads, seq) fp32, sinks (heads,) -> (out' in out's dtype, lse' fp32), new tensors (not differentiable
    here: :func:`sink_grad` is the sinks' gradient; the kernels' backward with the final lse' is exact for q/k/v).
    """
    acc_out, acc_lse = out.float(), lse.clone()  # fp32 accumulators, as in a ring's merge
    sink_lse = sinks.detach().float()[None, :, None].expand_as(lse)
    merge_eager_(acc_out, acc_lse, acc_out.new_zeros(()).expand_as(acc_out), sink_lse)
    return acc_out.to(out.dtype), acc_lse


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """d loss / d sinks (heads,) of :func:`merge_sinks` from the final out (b, s, h, d), lse' (b, h, s) and dout:
    ``-sum_rows exp(sink - lse') * (dout . out)`` (the sink's probability times the row's delta), over this
    rank's rows (the usual gradient all-reduce sums the ranks)."""
    delta = (dout.float() * out.float()).sum(-1).transpose(1, 2)  # (b, h, s)
    p_sink = torch.exp(sinks.detach().float()[None, :, None] - lse)
    return -(p_sink * delta).sum(dim=(0, 2)).to(sinks.dtype)
