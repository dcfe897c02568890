"""Single-process checks of the zigzag schedule (virtual ranks), the kernels and the LSE merge."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from easy_context.core.lse_merge import merge_into_
from easy_context.kernels import KERNELS, get_kernel
from easy_context.zigzag_ring_attn import zigzag_shard, zigzag_unshard
from easy_context.zigzag_ring_attn.simulate import virtual_backward, virtual_forward
from tests.reference import reference_with_grads, rel_err


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
