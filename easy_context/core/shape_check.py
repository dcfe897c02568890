"""Agreement of the attention inputs across the SP group, checked before any SP communication.

Ring and all-to-all exchanges assume every rank holds a shard of the same shape and dtype and runs the same
attention (causal or not, same softmax scale); a mismatch (an unpadded batch, a rank that sharded differently,
one rank's bad input) would otherwise surface as a hang, corrupted data or silently wrong attention. Every call
does one tiny all-gather on every rank, *also on a rank whose own inputs are invalid*: each rank's local verdict
travels with its signature, so all ranks raise together (a rank that raised alone would leave the others
waiting in the next collective). Set ``EASY_CONTEXT_SHAPE_CHECK=0`` to skip the all-gather once a setup is known
to be right (it costs one host sync per attention call on GPUs); local errors are then raised on their own rank.
"""

from __future__ import annotations

import os
import struct

import torch
import torch.distributed as dist

from easy_context.core.layout import seq_multiple_call
from easy_context.kernels.base import check_shapes

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


def shape_check_enabled() -> bool:
    return os.environ.get("EASY_CONTEXT_SHAPE_CHECK", "1") != "0"


def local_input_error(algo: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """What is wrong with this rank's own q, k, v (None when they are fine)."""
    try:
        check_shapes(q, k, v, causal=False, v_dim_may_differ=True)
    except ValueError as exc:
        return f"{algo}: {exc}"
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"{algo}: {q.dtype} inputs are not supported (kernels run in fp32, bf16 or fp16): cast to float32"
    if q.shape[1] != k.shape[1]:
        return (f"{algo}: q has {q.shape[1]} local rows but k/v have {k.shape[1]}; sequence-parallel attention is "
                "self-attention over one sharded sequence: shard q, k and v the same way")  # fmt: skip
    return None


def _signature(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, ok: bool, documents=None,
               v_dim: int = -1) -> list[int]:  # fmt: skip
    """Fixed-length int64 summary: ok, q shape, k shape (padded to 4 dims), dtype, causal, scale's bits, documents'
    hash (0: none; ints and tuples hash the same in every process), V's head dim."""
    dims = lambda t: [*t.shape[:4], *[-1] * (4 - min(t.dim(), 4))]  # noqa: E731
    scale_bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0]  # exact: compared bit for bit
    docs = 0 if documents is None else hash((documents.length, documents.starts)) % 2**62 + 1
    return [int(ok), *dims(q), *dims(k), _DTYPE_CODES.get(q.dtype, 9), int(causal), scale_bits, docs, v_dim]


def check_local_shapes(algo: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                       causal: bool = True, scale: float = 1.0, pad_hint: str | None = None,
                       documents=None) -> None:  # fmt: skip
    """Raise a clear ValueError on every rank unless every rank holds valid, equally shaped q/k/v shards and
    asks for the same attention (``causal``, ``scale``, ``documents``). ``pad_hint``: the ``seq_multiple`` call to
    suggest."""
    error = local_input_error(algo, q, k, v)
    world = dist.get_world_size(group)
    if world == 1 or not shape_check_enabled():
        if error:
            raise ValueError(error)
        return
    device = torch.device("cpu") if dist.get_backend(group) == "gloo" else q.device
    v_dim = v.shape[-1] if v.dim() else -1
    mine = torch.tensor(_signature(q, k, causal, scale, error is None, documents, v_dim), dtype=torch.int64,
                        device=device)  # fmt: skip
    every = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(every, mine, group=group)
    rows = [tuple(row) for row in every.view(world, -1).tolist()]
    if error:
        raise ValueError(error)
    bad = [r for r, row in enumerate(rows) if not row[0]]
    if bad:
        raise ValueError(f"{algo}: SP rank(s) {bad} of this group rejected their attention inputs (their error "
                         "says why); every rank must call attention with valid, equally sharded q, k, v")  # fmt: skip
    if len({row[1:10] for row in rows}) != 1 or len({row[13] for row in rows}) != 1:
        hint = pad_hint or seq_multiple_call(algo, "world_size")
        raise ValueError(
            f"{algo}: every rank must hold a shard of the same shape and dtype; got local (q shape, k shape, dtype "
            f"code, v head dim) {[(row[1:5], row[5:9], row[9], row[13]) for row in rows]} (local lengths "
            f"{[row[2] for row in rows]}). "
            f"Pad the full sequence with easy_context.pad_to_multiple(x, {hint}) and shard it with "
            "easy_context.extract_local"
        )
    if len({row[10:12] for row in rows}) != 1:
        scales = [struct.unpack("<d", struct.pack("<q", row[11]))[0] for row in rows]
        raise ValueError(f"{algo}: every rank must run the same attention; got causal {[bool(r[10]) for r in rows]}, "
                         f"softmax scale {scales}")  # fmt: skip
    differ = [r for r, row in enumerate(rows) if row[12] != rows[0][12]]
    if differ:
        raise ValueError(f"{algo}: every rank must pass the same documents (those of the full sequence); "
                         f"SP ranks {differ} differ from rank 0")  # fmt: skip
