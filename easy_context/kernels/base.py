"""The local attention kernel interface every sequence-parallel backend computes with.

Layouts (flash-attn convention):
    q:   (batch, seq_q, heads_q, head_dim)
    k/v: (batch, seq_k, heads_kv, head_dim), heads_q % heads_kv == 0 (GQA/MQA allowed)
    out: (batch, seq_q, heads_q, head_dim), dtype of q
    lse: (batch, heads_q, seq_q), float32, natural-log log-sum-exp of the scaled scores

``causal=True`` requires ``seq_q == seq_k`` (a diagonal block): sequence-parallel schedules only ever ask
for square causal blocks, and kernels disagree on how to align a rectangular causal mask.

Variants (docs/attention_variants.md). A kernel declares the ones it computes in ``supports``:

* ``"softcap"``: Gemma-2 logit soft-capping, scores ``s -> cap * tanh(s / cap)`` (after the softmax scale) before
  the softmax; the LSE is of the capped scores. Bound to the kernel once per call (:meth:`AttnKernel.with_softcap`).
* ``"band"``: a per-block band ``(lo, hi)``: query row i of the block sees key row j only when
  ``lo <= i - j <= hi`` (block-local rows; how a sliding window reaches the blocks it cuts,
  :mod:`easy_context.core.windows`). Every query row of a band block has at least one key.

Attention sinks need no kernel support: they enter once, in the merge (:func:`easy_context.core.lse_merge.merge_sinks`).
A kernel asked for a variant it does not compute raises :class:`VariantError` naming the kernels that do.
The backward receives the *final* (possibly merged) ``out`` and ``lse`` of the query rows, which is what
makes block-wise backward of ring schedules exact.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

ForwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (q, k, v, causal, scale[, softcap=, band=])
BackwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (dout, q, k, v, out, lse, causal, ..)
Band = tuple[int, int]  # (lo, hi): block-local query row i sees key row j iff lo <= i - j <= hi
VARIANTS = ("softcap", "band")


class VariantError(NotImplementedError):
    """A kernel was asked for an attention variant it does not compute (never computed with other math)."""


# name -> the variants that kernel computes, in the package's order: filled by easy_context.kernels when it builds
# its KERNELS table (this module sits below it and cannot import it)
SUPPORTS: dict[str, frozenset[str]] = {}


def kernels_supporting(variant: str) -> list[str]:
    """Names of the kernels that compute ``variant`` ("softcap", "band")."""
    return [name for name, supports in SUPPORTS.items() if variant in supports]


def variant_error(kernel: str, variant: str, able: list[str]) -> VariantError:
    what = {"softcap": "logit soft-capping", "band": "sliding-window (band) blocks"}.get(variant, variant)
    return VariantError(
        f"attention kernel {kernel!r} cannot compute {what}; use kernel={' or '.join(map(repr, able))} "
        "(or kernel='auto', which picks one that can)"
    )


@dataclass(frozen=True)
class AttnKernel:
    """A local attention kernel that returns the log-sum-exp.

    ``forward(q, k, v, causal, softmax_scale, band=None) -> (out, lse)``
    ``backward(dout, q, k, v, out, lse, causal, softmax_scale, band=None) -> (dq, dk, dv)`` (dk/dv have k's heads).
    ``supports``: the variants (:data:`VARIANTS`) its ``*_impl`` take as keywords ``softcap=`` / ``band=``;
    ``softcap``: the cap bound by :meth:`with_softcap` (None: none), passed to every call.
    ``skips_band_tiles``: a band block costs only its band (the kernel skips the tiles outside it, as flash-attention's
    window does); else long causal band blocks are tiled before the call (:func:`easy_context.core.windows.tile_bands`).
    """

    name: str
    forward_impl: ForwardFn
    backward_impl: BackwardFn
    expands_kv: bool = False  # repeats K/V to the query heads inside the call (counts toward its size)
    supports: frozenset[str] = frozenset()
    softcap: float | None = None
    skips_band_tiles: bool = False
    heads_per_call: int | None = None  # a memory bound set by :meth:`with_heads_per_call` (None: whole calls)

    def with_softcap(self, softcap: float | None) -> AttnKernel:
        """This kernel capping every score at ``softcap`` (``cap * tanh(s / cap)``); itself for None."""
        if not softcap:
            return self
        self.require("softcap")
        return replace(self, softcap=float(softcap))

    def with_heads_per_call(self, heads: int | None) -> AttnKernel:
        """This kernel called on at most ``heads`` query heads at a time; itself for None. Attention is independent
        per head, so the split is exact; what it saves is the backward's memory, which scales with the heads of a
        call: the fp32 dq accumulator, the kernel's dq/dk/dv and, under GQA, the dK/dV it computes per query head
        before summing each group (the K/V heads of a call are summed here in fp32 instead)."""
        return self if check_heads_per_call(heads) is None else replace(self, heads_per_call=heads)

    def require(self, variant: str) -> None:
        """:class:`VariantError` naming the kernels that can, unless this kernel computes ``variant``."""
        if variant not in self.supports:
            raise variant_error(self.name, variant, kernels_supporting(variant))

    def _variant_kw(self, band: Band | None) -> dict:
        kw: dict = {} if self.softcap is None else {"softcap": self.softcap}
        if band is not None:
            self.require("band")
            kw["band"] = band
        return kw

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        check_shapes(q, k, v, causal)
        kw = self._variant_kw(band)
        groups = head_groups(q, k, expands_kv=self.expands_kv, max_heads=self.heads_per_call)
        if groups is None:
            return self.forward_impl(q, k, v, causal, softmax_scale, **kw)
        outs, lses = zip(*(self.forward_impl(q[:, :, qs].contiguous(), k[:, :, ks].contiguous(),
                                             v[:, :, ks].contiguous(), causal, softmax_scale, **kw)
                           for qs, ks in groups))  # fmt: skip
        return torch.cat(outs, dim=2), torch.cat(lses, dim=1)

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        softmax_scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kw = self._variant_kw(band)
        groups = head_groups(q, k, expands_kv=self.expands_kv, max_heads=self.heads_per_call)
        if groups is None:
            return self.backward_impl(dout, q, k, v, out, lse, causal, softmax_scale, **kw)
        dq = torch.empty_like(q)
        shared = len(groups) > k.shape[2]  # several query chunks per K/V head: their dK/dV add up (in fp32)
        dk = torch.zeros(k.shape, dtype=torch.float32 if shared else k.dtype, device=k.device)
        dv = torch.zeros_like(dk)
        for qs, ks in groups:
            g = self.backward_impl(*(t[:, :, qs].contiguous() for t in (dout, q)), k[:, :, ks].contiguous(),
                                   v[:, :, ks].contiguous(), out[:, :, qs].contiguous(), lse[:, qs].contiguous(),
                                   causal, softmax_scale, **kw)  # fmt: skip
            dq[:, :, qs] = g[0]
            dk[:, :, ks] += g[1]
            dv[:, :, ks] += g[2]
        return dq, dk.to(k.dtype), dv.to(v.dtype)


def check_heads_per_call(heads: int | None) -> int | None:
    """``heads`` when it is None or a positive integer; else ``ValueError`` naming the value."""
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ValueError(f"heads_per_call must be a positive integer or None, got {heads!r}")
    return heads


# Fused attention kernels index with 32-bit offsets in places: measured on an H200 (torch 2.11, cuDNN SDPA), one
# call on tensors past 2**31 elements returns silently wrong results. Larger calls are split over heads.
MAX_KERNEL_ELEMENTS = int(os.environ.get("EASY_CONTEXT_MAX_KERNEL_ELEMENTS", 2**31 - 1))


def head_groups(
    q: torch.Tensor, k: torch.Tensor, limit: int | None = None, expands_kv: bool = False, max_heads: int | None = None
) -> list[tuple[slice, slice]] | None:
    """(query-head slice, K/V-head slice) pairs splitting one call into calls whose q, k, v, out and fp32
    workspaces each stay within ``limit`` elements and that take at most ``max_heads`` query heads (None: any);
    None when one call already does (the common case).
    ``expands_kv``: the kernel repeats K/V to the query heads, so K/V count with the query heads of the call.

    Attention is independent per head, so the split is exact. Chunks hold whole GQA groups when they can; past
    that, a chunk of query heads shares one K/V head (and the backward adds their dK/dV).
    """
    limit = MAX_KERNEL_ELEMENTS if limit is None else limit
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    per_q_head, per_kv_head = b * sq * d, b * sk * d
    rep = hq // hkv
    kv_heads = (lambda c: c) if expands_kv else (lambda c: max(1, c // rep))  # K/V heads of a call with c q heads
    most = hq if max_heads is None else max_heads
    if max(per_q_head, per_kv_head) > limit:
        raise ValueError(
            f"attention of one head over {max(sq, sk)} tokens (batch {b}, head_dim {d}) exceeds {limit} elements "
            "per kernel call; shard the sequence over more ranks (sequence parallelism)"
        )
    c = call_heads(hq, hkv, lambda c: per_q_head * c <= limit and per_kv_head * kv_heads(c) <= limit and c <= most)
    if c is None:
        raise ValueError(f"cannot split {hq} query / {hkv} key-value heads into kernel calls of <= {limit} elements")
    if c == hq:
        return None
    return [(slice(i * c, (i + 1) * c), slice(i * c // rep, (i * c + c - 1) // rep + 1)) for i in range(hq // c)]


def call_heads(hq: int, hkv: int, fits: Callable[[int], bool]) -> int | None:
    """The most query heads per kernel call (``hq`` split into the fewest equal chunks) that ``fits`` and keeps the
    GQA groups aligned (a call holds whole groups, or a part of one group); None when no chunk fits."""
    for n in range(1, hq + 1):
        if hq % n or (1 < n <= hkv and hkv % n) or (n > hkv and n % hkv):
            continue
        if fits(hq // n):
            return hq // n
    return None


def check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, v_dim_may_differ: bool = False
) -> None:
    """Raise a clear error for inputs no kernel can take (``v_dim_may_differ``: V's head dim may differ from Q/K's,
    for callers that pad them to one, see :func:`easy_context.core.seq_algo.equal_head_dims`)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention expects (batch, seq, heads, head_dim) tensors, got q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    kv_differ = k.shape[:3] != v.shape[:3] if v_dim_may_differ else k.shape != v.shape
    if kv_differ or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"incompatible q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(
            f"empty sequence: q{tuple(q.shape)} k{tuple(k.shape)} (a zero-length shard: the sequence is shorter than "
            "the number of ranks it is split over, or empty); give every rank at least one token"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]}) for GQA")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal local attention needs seq_q == seq_k, got {q.shape[1]} and {k.shape[1]}")


def default_scale(head_dim: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, s, h_kv, d) -> (b, s, h_kv * n_rep, d), each KV head repeated for its query group."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=2)


def sum_kv_groups(dx: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """Inverse of :func:`repeat_kv` for gradients: (b, s, h_kv * n_rep, d) -> (b, s, h_kv, d)."""
    b, s, h, d = dx.shape
    return dx if h == heads_kv else dx.view(b, s, heads_kv, h // heads_kv, d).sum(dim=3)


def allowed_keys(sq: int, sk: int, causal: bool, band: Band | None, device) -> torch.Tensor | None:
    """(sq, sk) bool: which key row each query row of a block sees (None: all of them)."""
    if not causal and band is None:
        return None
    d = torch.arange(sq, device=device)[:, None] - torch.arange(sk, device=device)[None]  # i - j
    ok = d >= 0 if causal else torch.ones(sq, sk, dtype=torch.bool, device=device)
    if band is not None:
        ok &= (d >= band[0]) & (d <= band[1])
    return ok
