"""Fused CUDA version of :func:`easy_context.core.lse_merge.merge_into_` (one pass, Triton).

The eager merge makes two passes over the fp32 accumulator plus temporaries; this kernel reads the
accumulator, the block output and both LSEs once and writes the accumulator and LSE once: about a third
of the memory traffic, which is what the merge costs next to the attention kernels on an H200
(docs/benchmarks.md). One program handles one (batch, seq) row and up to 4096 (head, dim) elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_rows(
    acc_ptr, out_ptr, acc_lse_ptr, lse_ptr,
    sab, sas, sah, sob, sos, soh,
    slab, slah, slas, slb, slh, sls,
    S, H, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: buffers can exceed 2^31 elements
    b = row // S
    s = row % S
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    hm = h < H
    la = tl.load(acc_lse_ptr + b * slab + h * slah + s * slas, mask=hm, other=0.0)
    lb = tl.load(lse_ptr + b * slb + h * slh + s * sls, mask=hm, other=0.0)
    m = tl.maximum(la, lb)
    new = m + tl.log(tl.exp(la - m) + tl.exp(lb - m))
    wa = tl.exp(la - new)
    wb = tl.exp(lb - new)
    mask = hm[:, None] & (d[None, :] < D)
    a_ptrs = acc_ptr + b * sab + s * sas + h[:, None] * sah + d[None, :]
    o_ptrs = out_ptr + b * sob + s * sos + h[:, None] * soh + d[None, :]
    a = tl.load(a_ptrs, mask=mask, other=0.0)
    o = tl.load(o_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(a_ptrs, a * wa[:, None] + o * wb[:, None], mask=mask)
    tl.store(acc_lse_ptr + b * slab + h * slah + s * slas, new, mask=hm)


def merge_into_triton_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Same contract as :func:`easy_context.core.lse_merge.merge_into_`; needs unit stride on head_dim."""
    b, s, h, d = acc_out.shape
    block_d = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(h), max(1, 4096 // block_d))
    with torch.cuda.device(acc_out.device):
        _launch(acc_out, acc_lse, out, lse, b, s, h, d, block_h, block_d)


def _launch(acc_out, acc_lse, out, lse, b, s, h, d, block_h, block_d) -> None:
    _merge_rows[(b * s, triton.cdiv(h, block_h))](
        acc_out, out, acc_lse, lse,
        *acc_out.stride()[:3], *out.stride()[:3], *acc_lse.stride(), *lse.stride(),
        s, h, d,
        BLOCK_H=block_h, BLOCK_D=block_d,
    )  # fmt: skip
