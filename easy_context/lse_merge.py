"""The one log-sum-exp merge of partial attention results, in float32.

Attention over the union of two key sets, from the results over each:
    lse = logaddexp(lse_a, lse_b)
    out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)
Accumulating in fp32 keeps ring results independent of the ring size (bf16 accumulation is the known
source of error growing with the number of ring steps).
"""

from __future__ import annotations

import torch


def merge_into_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge a block result into fp32 accumulators, in place (views of larger buffers are fine).

    acc_out: (batch, seq, heads, dim) float32      out: same shape, any float dtype
    acc_lse: (batch, heads, seq) float32            lse: same shape, float32
    """
    new_lse = torch.logaddexp(acc_lse, lse)
    w_acc = torch.exp(acc_lse - new_lse).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
    acc_out.mul_(w_acc).add_(out.float() * w_new)
    acc_lse.copy_(new_lse)
