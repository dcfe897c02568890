"""Single-process checks of the zigzag schedule (virtual ranks), the kernels and the LSE merge."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from easy_context.backends.zigzag_ring_attn import zigzag_shard, zigzag_unshard
from easy_context.backends.zigzag_ring_attn.simulate import virtual_backward, virtual_forward
from easy_context.core.lse_merge import merge_into_
from easy_context.kernels import KERNELS, get_kernel
from tests.support.reference import reference_with_grads, rel_err


def _rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("heads", [(5, 5), (6, 2)])
def test_virtual_zigzag_matches_reference(world, heads):
    hq, hkv = heads
    b, s, d = 2, 2 * world * 3, 32
    q, dout = _rand(b, s, hq, d, seed=1), _rand(b, s, hq, d, seed=2)
    k, v = _rand(b, s, hkv, d, seed=3), _rand(b, s, hkv, d, seed=4)
    ref = reference_with_grads(q, k, v, dout, causal=True)
    shard = lambda x: [zigzag_shard(x, r, world) for r in range(world)]  # noqa: E731
    kernel = get_kernel("cpu", "cpu", torch.float32, d)
    outs, lses = virtual_forward(shard(q), shard(k), shard(v), kernel, d**-0.5)
    grads = virtual_backward(shard(dout), shard(q), shard(k), shard(v), outs, lses, kernel, d**-0.5)
    assert rel_err(zigzag_unshard(outs), ref[0]) < 1e-5
    for got, want in zip(grads, ref[1:]):
        assert rel_err(zigzag_unshard(got), want) < 1e-5


@pytest.mark.parametrize("name", ["cpu", "math"])
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_forward_backward(name, causal):
    q, dout = _rand(2, 24, 6, 64, seed=5), _rand(2, 24, 6, 64, seed=6)
    k, v = _rand(2, 24, 3, 64, seed=7), _rand(2, 24, 3, 64, seed=8)
    kernel = KERNELS[name]
    out, lse = kernel.forward(q, k, v, causal, 0.125)
    grads = kernel.backward(dout, q, k, v, out, lse, causal, 0.125)
    ref = reference_with_grads(q, k, v, dout, causal, scale=0.125)
    assert lse.dtype == torch.float32 and lse.shape == (2, 6, 24)
    assert rel_err(out, ref[0]) < 1e-5
    for got, want in zip(grads, ref[1:]):
        assert got.shape == want.shape and rel_err(got, want) < 1e-5


def test_merge_equals_attention_over_union():
    q, k, v = _rand(1, 8, 2, 16, seed=9), _rand(1, 12, 2, 16, seed=10), _rand(1, 12, 2, 16, seed=11)
    kernel = KERNELS["cpu"]
    full, full_lse = kernel.forward(q, k, v, False, 0.25)
    out_a, lse_a = kernel.forward(q, k[:, :5], v[:, :5], False, 0.25)
    out_b, lse_b = kernel.forward(q, k[:, 5:], v[:, 5:], False, 0.25)
    acc_out, acc_lse = out_a.float().clone(), lse_a.clone()
    merge_into_(acc_out, acc_lse, out_b.to(torch.bfloat16), lse_b)
    assert rel_err(acc_lse, full_lse) < 1e-6
    assert rel_err(acc_out, full) < 1e-2  # one operand rounded to bf16
    acc_out, acc_lse = out_a.float().clone(), lse_a.clone()
    merge_into_(acc_out, acc_lse, out_b, lse_b)
    assert rel_err(acc_out, full) < 1e-6


def test_kernel_selection_errors():
    assert get_kernel("auto", "cpu", torch.bfloat16, 64).name == "cpu"
    with pytest.raises(ValueError, match="unknown attention kernel"):
        get_kernel("nope", "cpu", torch.float32, 64)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        get_kernel("cudnn", "cpu", torch.float32, 64)
    with pytest.raises(RuntimeError, match="flash-attn"):
        get_kernel("flash_attn", "cpu", torch.float32, 64)
    with pytest.raises(ValueError, match="unknown attention kernel"):
        ec.get_attn_func("zigzag_ring_attn", kernel="fa9")


def test_padding_helper_and_multiples():
    x = torch.arange(10).view(1, 10)
    m = ec.seq_multiple("zigzag_ring_attn", 3)
    assert m == 6
    padded = ec.pad_to_multiple(x, m, dim=1, value=-100)
    assert padded.shape == (1, 12) and padded[0, 10:].tolist() == [-100, -100]
    assert ec.seq_multiple("ulysses_attn", 3) == 3
    assert ec.seq_multiple("usp_attn", 6, ring_degree=3) == 6  # 3 * lcm(2, 2)
    assert ec.seq_multiple("usp_attn", 3, ring_degree=1) == 6  # 1 * lcm(2, 3)
    assert ec.seq_multiple("data_parallel", 4) == 1
    for algo in ec.SEQ_ALGOS:
        x = torch.arange(2 * 3 * 4).view(1, -1)
        shards = [ec.extract_local(algo, x, r, 4 if algo != "usp_attn" else 4) for r in range(4)]
        if algo != "data_parallel":
            assert sorted(torch.cat(shards, 1)[0].tolist()) == list(range(24))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="pad_to_multiple"):
        ec.extract_local("zigzag_ring_attn", torch.zeros(1, 2999), 0, 4)
    with pytest.raises(ValueError, match="unknown sequence-parallel mode"):
        ec.extract_local("ring", torch.zeros(1, 8), 0, 2)
    with pytest.raises(TypeError, match="ring_degree"):
        ec.get_attn_func("zigzag_ring_attn", ring_degree=2)
    with pytest.raises(ValueError, match="ring_degree=3 must divide"):
        ec.extract_local("usp_attn", torch.zeros(1, 24), 0, 4, ring_degree=3)
    attn = ec.get_attn_func("data_parallel")
    q = torch.zeros(1, 4, 4, 8)
    with pytest.raises(NotImplementedError, match="dropout"):
        attn(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attn(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="batch, seq, heads, head_dim"):
        attn(q[0], q[0], q[0])


def test_kernel_probe_does_not_remember_out_of_memory(monkeypatch):
    import easy_context.kernels as kernels

    calls = []

    def flaky_probe(kernel, device, dtype, head_dim):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("transient")
        return True

    monkeypatch.setattr(kernels, "_probe", flaky_probe)
    monkeypatch.setattr(kernels, "_PROBED", {})
    assert not kernels.kernel_works("cpu", "cpu", torch.float32, 24)  # OOM: not usable now...
    assert kernels.kernel_works("cpu", "cpu", torch.float32, 24)  # ...but probed again next time
    assert kernels.kernel_works("cpu", "cpu", torch.float32, 24) and len(calls) == 2  # then cached


@pytest.mark.parametrize("limit", [2 * 24 * 64 * 3, 2 * 24 * 64 * 2, 2 * 24 * 64])
def test_kernel_calls_split_over_heads_past_the_element_limit(monkeypatch, limit):
    """Calls past MAX_KERNEL_ELEMENTS (2^31: kernels with 32-bit offsets go silently wrong) are split over heads,
    exactly: whole GQA groups (limit 3 or 2 heads) or query heads sharing one K/V head (limit 1 head)."""
    import easy_context.kernels.base as base

    q, dout = _rand(2, 24, 6, 64, seed=5), _rand(2, 24, 6, 64, seed=6)
    k, v = _rand(2, 24, 3, 64, seed=7), _rand(2, 24, 3, 64, seed=8)
    kernel = KERNELS["cpu"]
    out, lse = kernel.forward(q, k, v, True, 0.125)
    grads = kernel.backward(dout, q, k, v, out, lse, True, 0.125)
    calls = []
    monkeypatch.setattr(base, "MAX_KERNEL_ELEMENTS", limit)
    spy = base.AttnKernel("spy", lambda *a: calls.append(a[0]) or kernel.forward_impl(*a), kernel.backward_impl)
    split_out, split_lse = spy.forward(q, k, v, True, 0.125)
    split_grads = spy.backward(dout, q, k, v, split_out, split_lse, True, 0.125)
    assert all(c.numel() <= limit for c in calls) and len(calls) > 1
    assert rel_err(split_out, out) < 1e-6 and rel_err(split_lse, lse) < 1e-6
    for got, want in zip(split_grads, grads):
        assert got.shape == want.shape and got.dtype == want.dtype and rel_err(got, want) < 1e-6
    k2 = _rand(2, 48, 3, 64, seed=9)  # K/V twice q's length (a zigzag off-diagonal block): 18432 elements
    assert base.head_groups(q, k2, limit=18432) is None
    assert len(base.head_groups(q, k2, limit=18432, expands_kv=True)) == 3  # expanded K/V: 36864 -> 3 calls
    with pytest.raises(ValueError, match="sequence parallelism"):
        base.head_groups(q, k, limit=24 * 64)  # one head over 2 x 24 tokens is already past it


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("window", [3, 7, 40])
def test_virtual_schedules_with_a_window_match_the_banded_reference(world, window):
    """The virtual-rank schedules the GPU window benchmark times (bench/attention.py --windows) are exact."""
    from easy_context.backends.dist_flash_attn import simulate as dist_sim
    from easy_context.backends.ulysses_attn import contiguous_shard

    b, s, hq, hkv, d = 1, 8 * world, 4, 2, 16
    q, dout = _rand(b, s, hq, d, seed=21), _rand(b, s, hq, d, seed=22)
    k, v = _rand(b, s, hkv, d, seed=23), _rand(b, s, hkv, d, seed=24)
    i = torch.arange(s)
    keep = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] < window)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    rep = lambda x: x.repeat_interleave(hq // hkv, 2).transpose(1, 2)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(
        leaves[0].transpose(1, 2), rep(leaves[1]), rep(leaves[2]), attn_mask=keep, scale=d**-0.5
    ).transpose(1, 2)
    ref.backward(dout.double())
    want = [ref.detach(), *(x.grad for x in leaves)]
    kernel = KERNELS["cpu"]
    for sim, shard, unshard in (
        (None, zigzag_shard, zigzag_unshard),
        (dist_sim, contiguous_shard, lambda xs: torch.cat(xs, 1)),
    ):
        parts = [[shard(x, r, world) for r in range(world)] for x in (q, k, v, dout)]
        if sim is None:
            outs, lses = virtual_forward(*parts[:3], kernel, d**-0.5, True, window=window)
            grads = virtual_backward(parts[3], *parts[:3], outs, lses, kernel, d**-0.5, True, window=window)
        else:
            outs, lses = sim.virtual_forward(*parts[:3], kernel, d**-0.5, True, window=window)
            grads = sim.virtual_backward(parts[3], *parts[:3], outs, lses, kernel, d**-0.5, True, window=window)
        for got, ref_x in zip((outs, *grads), want):
            assert rel_err(unshard(list(got)), ref_x) < 1e-5


@pytest.mark.parametrize("window", [1, 5, 32, 45])
def test_long_band_blocks_are_tiled_only_for_kernels_that_mask(window):
    """A windowed causal diagonal is one band block: a kernel that skips the tiles outside a band (fa4) gets it in
    one call, the others get diagonal tiles plus the band below each; both give the same attention."""
    from dataclasses import replace

    from easy_context.core.blockwise import (
        Block,
        ForwardAccumulator,
        add_kv_grads_,
        backward_blocks,
        forward_blocks,
        kernel_blocks,
    )
    from easy_context.core.spans import Span
    from easy_context.core.windows import window_blocks

    n, d = 200, 16
    whole = (Span(0, 0, n),)
    blocks = window_blocks([Block(slice(0, n), slice(0, n), True)], whole, whole, window)
    assert len(blocks) == 1 and blocks[0].band == ((0, window - 1) if window < n else None)
    masking, skipping = KERNELS["cpu"], replace(KERNELS["cpu"], skips_band_tiles=True)
    assert kernel_blocks(skipping, blocks) == blocks
    tiles = kernel_blocks(masking, blocks)
    n_tiles = -(-n // max(window, 32))
    assert len(tiles) == (n_tiles if window == 1 else 2 * n_tiles - 1)  # a 1-token window has no band below
    q, k, v, dout = (_rand(1, n, 2, d, seed=30 + i) for i in range(4))
    results = []
    for kern in (masking, skipping):
        acc = ForwardAccumulator(q)
        forward_blocks(kern, q, k, v, blocks, d**-0.5, acc)
        out, lse = acc.result(q.dtype)
        dq = torch.zeros_like(q)
        kv = backward_blocks(kern, dout, q, k, v, out, lse, blocks, d**-0.5, dq)
        dkv = add_kv_grads_(torch.zeros(2, *k.shape), kv)
        results.append((out, dq, dkv[0], dkv[1]))
    i = torch.arange(n)
    keep = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in leaves), attn_mask=keep, scale=d**-0.5
    ).transpose(1, 2)
    ref.backward(dout.double())
    for got in results:
        for g, want in zip(got, (ref.detach(), *(x.grad for x in leaves))):
            assert (g.double() - want).abs().max() <= 1e-5 * max(1.0, want.abs().max())  # dq is 0 for a 1-key window
