"""Kernel ``flex`` (PyTorch FlexAttention) on this CPU machine: what runs here and what is refused.

FlexAttention has no backward on CPU, so ``flex`` cannot train here and ``kernel_works`` refuses it with one line.
Its forward runs eagerly on CPU, which checks the adapter (block masks of bands at any offset, GQA, soft-capping, the
natural-log LSE) against the ``math`` reference; the backward's merge algebra (:func:`backward_by_recompute`) is checked
with a differentiable math forward in its place, through the real ring schedule. The CUDA run of the same kernel,
forward and backward: ``python tests/gpu/check_flex.py`` on a GPU machine.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace

import pytest
import torch

from easy_context import kernels
from easy_context.backends.zigzag_ring_attn import zigzag_shard, zigzag_unshard
from easy_context.backends.zigzag_ring_attn.simulate import virtual_backward, virtual_forward
from easy_context.core.block import Block
from easy_context.core.spans import Span
from easy_context.core.windows import window_blocks
from easy_context.kernels import KERNELS, get_kernel, kernel_works, kernels_supporting
from easy_context.kernels.base import allowed_keys
from easy_context.kernels.flex import FLEX, backward_by_recompute, block_mask, effective_band, tile_kinds
from easy_context.kernels.math_ref import MATH, math_forward
from tests.support.reference import rel_err

HQ, HKV, D = 4, 1, 32  # GQA 4/1, head_dim 32


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qkv(sq, sk, seed, b=2):
    return _rand(b, sq, HQ, D, seed=seed), _rand(b, sk, HKV, D, seed=seed + 1), _rand(b, sk, HKV, D, seed=seed + 2)


def _math_backward_by_recompute(dout, q, k, v, out, lse, causal, scale, softcap=None, band=None):
    """The flex backward's algebra with the differentiable math forward in place of FlexAttention (CPU has none)."""
    fwd = lambda a, b, c: math_forward(a, b, c, causal, scale, softcap, band)  # noqa: E731
    return backward_by_recompute(fwd, dout, q, k, v, out, lse)


# FlexAttention's forward on CPU, the backward's recompute algebra around the math forward
FLEX_CPU = replace(FLEX, backward_impl=_math_backward_by_recompute)


# --- registration and the auto choice ---------------------------------------------------------------------------------
def test_flex_is_registered_with_its_variants():
    assert "flex" in kernels.KERNEL_NAMES and KERNELS["flex"] is FLEX
    assert "flex" in kernels_supporting("band") and "flex" in kernels_supporting("softcap")
    assert FLEX.skips_band_tiles and not FLEX.expands_kv  # block-sparse band, native GQA
    assert kernels.CUDA_PREFERENCE[:2] == ("fa4", "cudnn") and kernels.CUDA_PREFERENCE[-1] == "flex"


def test_flex_on_cpu_is_refused_in_one_line_without_a_probe(monkeypatch):
    def no_probe(*a):
        raise AssertionError("flex must be refused on CPU without a probe call")

    monkeypatch.setattr(kernels, "_probe", no_probe)
    monkeypatch.setattr(kernels, "_PROBED", {})
    with pytest.raises(RuntimeError) as err:
        get_kernel("flex", "cpu", torch.float32, 32)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("attention kernel 'flex' cannot run here: PyTorch's FlexAttention has no backward on cpu")
    assert "kernel='cpu' or 'auto'" in message
    assert not kernel_works("flex", "cpu", torch.bfloat16, 64)


@pytest.mark.parametrize("needs", [(), ("band",), ("softcap",), ("softcap", "band")])
def test_auto_on_cpu_never_picks_flex(needs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert get_kernel("auto", "cpu", torch.float32, 32, needs).name in ("cpu", "math")


def test_torch_itself_refuses_a_cpu_backward():
    """What the refusal stands on: FlexAttention raises for CPU inputs that require grad."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)


def _fake_cuda(monkeypatch, fa4: bool):
    """kernel_works treats "cuda" as a device whose probes pass; flash-attn-4 present or not."""
    monkeypatch.setattr(kernels, "_PROBED", {})
    monkeypatch.setattr(kernels, "_PROBE_ERRORS", {})
    monkeypatch.setattr(kernels, "_device_key", lambda device: device.type if device.type != "cuda" else "cuda:0 X")
    monkeypatch.setattr(kernels, "_probe", lambda kern, dev, dtype, d: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())

    def fa4_reason(device, dtype, head_dim):
        if not fa4:
            return "flash_attn.cute (FlashAttention-4) is not importable"
        return None if dtype in (torch.bfloat16, torch.float16) else "flash-attn-4 computes bfloat16 and float16 only"

    monkeypatch.setattr(kernels, "fa4_unavailable_reason", fa4_reason)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_auto_on_a_gpu_without_fa4_picks_flex_for_window_blocks(monkeypatch, dtype):
    _fake_cuda(monkeypatch, fa4=False)
    assert get_kernel("auto", "cuda", dtype, 256, ("band",)).name == "flex"
    assert get_kernel("auto", "cuda", dtype, 256, ("softcap",)).name == "flex"
    assert get_kernel("auto", "cuda", dtype, 256, ("softcap", "band")).name == "flex"
    assert get_kernel("auto", "cuda", dtype, 256).name == "cudnn"  # full layers keep the faster kernel
    assert get_kernel("flex", "cuda", dtype, 256, ("band",)) is FLEX
    with pytest.raises(kernels.VariantError, match="'cudnn' cannot compute sliding-window .*'flex'"):
        get_kernel("cudnn", "cuda", dtype, 256, ("band",))


def test_auto_on_a_gpu_with_fa4_keeps_fa4(monkeypatch):
    _fake_cuda(monkeypatch, fa4=True)
    assert get_kernel("auto", "cuda", torch.bfloat16, 256, ("band",)).name == "fa4"
    assert get_kernel("auto", "cuda", torch.float32, 256, ("band",)).name == "flex"  # fa4 computes 16-bit types only


# --- the block mask ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sq,sk,lo,hi", [(300, 500, -100, 40), (256, 256, 0, 130), (1000, 700, 5, 5),
                                         (128, 384, -256, -129), (70, 70, 0, 69)])  # fmt: skip
def test_tile_kinds_match_the_dense_mask(sq, sk, lo, hi):
    block = 64
    partial, full = tile_kinds(sq, sk, lo, hi, "cpu", block=block)
    ok = allowed_keys(sq, sk, False, (lo, hi), "cpu")
    padded = torch.nn.functional.pad(ok, (0, -sk % block, 0, -sq % block))  # padding counts as masked
    tiles = padded.view(-(-sq // block), block, -(-sk // block), block)
    assert torch.equal(partial | full, tiles.any(3).any(1))
    assert torch.equal(full, tiles.all(3).all(1))
    assert not (partial & full).any()


def test_block_mask_is_built_once_per_shape_and_band():
    cpu = torch.device("cpu")
    m = block_mask(300, 500, -100, 40, cpu)
    assert block_mask(300, 500, -100, 40, cpu) is m and block_mask(300, 500, -99, 40, cpu) is not m
    partial, full = tile_kinds(300, 500, -100, 40, cpu)
    assert torch.equal(m.to_dense()[0, 0].bool(), partial | full)
    assert m.seq_lengths == (300, 500)


def test_effective_band():
    assert effective_band(8, 8, False, None) is None
    assert effective_band(8, 8, True, None) == (0, 8)
    assert effective_band(8, 8, True, (-3, 5)) == (0, 5)
    assert effective_band(4, 9, False, (-3, 5)) == (-3, 5)
    with pytest.raises(ValueError, match="empty band"):
        effective_band(8, 8, True, (-5, -1))


# --- forward parity (CPU, eager FlexAttention) ------------------------------------------------------------------------
@pytest.mark.parametrize("window", [4, 7, 16])
@pytest.mark.parametrize("seq", [20, 150])
def test_forward_causal_window_matches_math(window, seq):
    q, k, v = _qkv(seq, seq, seed=window + seq)
    band = (0, window - 1)
    out, lse = FLEX.forward(q, k, v, True, D**-0.5, band)
    ref_out, ref_lse = MATH.forward(q, k, v, True, D**-0.5, band)
    assert out.shape == q.shape and lse.shape == (2, HQ, seq) and lse.dtype == torch.float32
    assert rel_err(out, ref_out) < 1e-5 and (lse - ref_lse).abs().max() < 1e-5  # natural-log LSE


@pytest.mark.parametrize("causal", [True, False])
def test_forward_without_band_and_with_softcap_matches_math(causal):
    q, k, v = _qkv(48, 48, seed=3)
    for softcap in (None, 5.0):
        kern = FLEX.with_softcap(softcap)
        out, lse = kern.forward(q * 3, k, v, causal, D**-0.5)
        ref_out, ref_lse = MATH.with_softcap(softcap).forward(q * 3, k, v, causal, D**-0.5)
        assert rel_err(out, ref_out) < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


@pytest.mark.parametrize("window", [4, 9, 16])
@pytest.mark.parametrize("q_start,k_start,n,m", [(40, 30, 24, 24), (100, 60, 33, 47), (64, 0, 16, 80), (20, 8, 12, 12)])
def test_forward_of_a_query_block_against_an_earlier_key_block(window, q_start, k_start, n, m):
    """The band blocks a ring schedule hands over: query rows at one position, keys at another (core.windows)."""
    q, k, v = _qkv(n, m, seed=n + m + window)
    blocks = window_blocks([Block(slice(0, n), slice(0, m), False)], (Span(0, q_start, n),), (Span(0, k_start, m),),
                           window)  # fmt: skip
    for blk in blocks:
        qq, kk, vv = q[:, blk.q_rows], k[:, blk.k_rows], v[:, blk.k_rows]
        out, lse = FLEX.forward(qq, kk, vv, blk.causal, D**-0.5, blk.band)
        ref_out, ref_lse = MATH.forward(qq, kk, vv, blk.causal, D**-0.5, blk.band)
        assert rel_err(out, ref_out) < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


# --- the backward's algebra, through the zigzag ring schedule ---------------------------------------------------------
@pytest.mark.parametrize("window", [4, 7, 16])
@pytest.mark.parametrize("world", [2, 4])
def test_zigzag_ring_with_window_matches_math(window, world):
    """Forward through FlexAttention (CPU), backward by recompute from the merged out/LSE, on virtual ranks: the
    schedule's band blocks (query and key blocks at other positions) and merges, against one math call."""
    s = 2 * world * 12
    q, k, v = _qkv(s, s, seed=world * 100 + window)
    dout = _rand(2, s, HQ, D, seed=7)
    band, scale = (0, window - 1), D**-0.5
    ref_out, ref_lse = MATH.forward(q, k, v, True, scale, band)
    ref_grads = MATH.backward(dout, q, k, v, ref_out, ref_lse, True, scale, band)
    shard = lambda x: [zigzag_shard(x, r, world) for r in range(world)]  # noqa: E731
    outs, lses = virtual_forward(shard(q), shard(k), shard(v), FLEX_CPU, scale, True, window=window)
    grads = virtual_backward(shard(dout), shard(q), shard(k), shard(v), outs, lses, FLEX_CPU, scale, True,
                             window=window)  # fmt: skip
    assert rel_err(zigzag_unshard(outs), ref_out) < 1e-5
    assert (zigzag_unshard(lses, dim=2) - ref_lse).abs().max() < 1e-5
    for got, want in zip(grads, ref_grads):
        assert rel_err(zigzag_unshard(got), want) < 1e-5


def test_backward_by_recompute_is_exact_for_a_merged_block():
    """Two key blocks merged: each block's gradient from the *merged* out/LSE equals the math kernel's."""
    n, scale = 24, D**-0.5
    q, k, v = _qkv(n, 2 * n, seed=11, b=1)
    dout = _rand(1, n, HQ, D, seed=12)
    ref_out, ref_lse = MATH.forward(q, k, v, False, scale)
    for part in (slice(0, n), slice(n, 2 * n)):
        kk, vv = k[:, part], v[:, part]
        got = FLEX_CPU.backward(dout, q, kk, vv, ref_out, ref_lse, False, scale)
        want = MATH.backward(dout, q, kk, vv, ref_out, ref_lse, False, scale)
        for g, w in zip(got, want):
            assert rel_err(g, w) < 1e-5
