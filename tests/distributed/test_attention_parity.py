"""Every SP backend vs single-device float64 attention: forward output and dq/dk/dv of each rank's shard."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from tests.support.dist_pool import RemoteError
from tests.support.reference import reference_with_grads, rel_err

TOL = {"float32": 1e-5, "bfloat16": 1.5e-2}  # measured max: fp32 2.0e-6, bf16 9.0e-3 (single-device bf16: 7.9e-3)

# (name, batch, seq per 2*world chunk count, heads_q, heads_kv, head_dim, causal)
CASES = {
    "mha": (2, 7, 4, 4, 32, True),
    "gqa": (1, 5, 8, 2, 64, True),
    "mqa_d128": (1, 3, 4, 1, 128, True),
    "noncausal": (2, 3, 4, 2, 32, False),
    "heads5": (1, 3, 5, 5, 64, True),  # ring-style backends only; Ulysses must refuse it clearly
}
ALGOS = [
    ("zigzag_ring_attn", {}),
    ("ulysses_attn", {}),
    ("usp_attn", {"ring_degree": 2}),
    ("usp_attn", {"ring_degree": 1}),
    ("dist_flash_attn", {}),
    ("data_parallel", {}),
]


def _inputs(seed, b, s, hq, hkv, d, dtype):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(b, s, hq, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v, dout


def parity_worker(rank, world, algo, opts, case, dtype_name, seed=0, heads_per_call=None):
    b, chunks, hq, hkv, d, causal = case
    dtype = getattr(torch, dtype_name)
    s = 2 * world * chunks
    q, k, v, dout = _inputs(seed, b, s, hq, hkv, d, dtype)
    ref = reference_with_grads(q, k, v, dout, causal)
    shard = lambda x: ec.extract_local(algo, x, rank, world, **opts)
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    attn = ec.get_attn_func(algo, heads_per_call=heads_per_call, **opts)
    out = attn(ql, kl, vl, causal=causal)
    assert out.shape == ql.shape and out.dtype == dtype
    out.backward(shard(dout))
    got = (out, ql.grad, kl.grad, vl.grad)
    return {name: rel_err(x, shard(r)) for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref)}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algo,opts", ALGOS, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x.values())))
def test_parity(dist_pool, world, algo, opts, case, dtype_name):
    hq, hkv = CASES[case][2], CASES[case][3]
    ulysses_degree = {"ulysses_attn": world, "usp_attn": world // opts.get("ring_degree", 1)}.get(algo, 1)
    if hq % ulysses_degree:
        with pytest.raises(RemoteError, match="not divisible by the Ulysses degree") as info:
            dist_pool(world).run(parity_worker, algo, opts, CASES[case], dtype_name)
        assert "usp_attn" in str(info.value)  # the error suggests the fix
        return
    errs = dist_pool(world).run(parity_worker, algo, opts, CASES[case], dtype_name)
    tol = TOL[dtype_name]
    for rank, e in enumerate(errs):
        assert max(e.values()) < tol, f"rank {rank}: {e} (tol {tol}, heads {hq}/{hkv})"


def split_parity_worker(rank, world, algo, opts, case, dtype_name):
    """parity_worker with the element limit of every kernel call set to one head's size (the >2^31-element path,
    forced small): every call with several query heads is split."""
    import easy_context.kernels.base as base

    original, split = base.head_groups, []

    def one_head_per_call(q, k, limit=None, expands_kv=False, max_heads=None):
        b, sq, hq, d = q.shape
        groups = original(q, k, max(b * sq * d, b * k.shape[1] * d), expands_kv, max_heads)
        split.append(groups is not None or hq == 1)
        return groups

    base.head_groups = one_head_per_call
    try:
        return parity_worker(rank, world, algo, opts, case, dtype_name), bool(split) and all(split)
    finally:
        base.head_groups = original


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", ["mha", "gqa"])
@pytest.mark.parametrize("algo,opts", ALGOS, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x.values())))
def test_parity_with_kernel_calls_split_over_heads(dist_pool, world, algo, opts, case):
    """Every backend, forward and backward, when each kernel call is split per head (GQA: query heads share a K/V
    head and their dK/dV add up): same tolerance as unsplit."""
    for rank, (errs, all_split) in enumerate(dist_pool(world).run(split_parity_worker, algo, opts, CASES[case],
                                                                 "float32")):  # fmt: skip
        assert all_split, f"rank {rank}: a kernel call was not split"
        assert max(errs.values()) < TOL["float32"], f"rank {rank}: {errs}"


def heads_per_call_worker(rank, world, algo, opts, case, dtype_name):
    """parity_worker with ``heads_per_call=1`` (``--attn-heads-per-call 1``), and the most query heads any kernel call
    of this rank received."""
    import easy_context.kernels.base as base
    from easy_context.kernels import get_kernel

    get_kernel("auto", "cpu", torch.float32, case[4])  # the kernel's one-time probe (whole calls), not counted
    original, most = base.head_groups, []

    def recording(q, k, limit=None, expands_kv=False, max_heads=None):
        groups = original(q, k, limit, expands_kv, max_heads)
        most.append(q.shape[2] if groups is None else max(g[0].stop - g[0].start for g in groups))
        return groups

    base.head_groups = recording
    try:
        return parity_worker(rank, world, algo, opts, case, dtype_name, heads_per_call=1), max(most)
    finally:
        base.head_groups = original


RING_STYLE = [a for a in ALGOS if a[0] in ("zigzag_ring_attn", "dist_flash_attn", "data_parallel")]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", ["gqa", "mqa_d128"])
@pytest.mark.parametrize("algo,opts", RING_STYLE, ids=lambda x: x if isinstance(x, str) else x.get("x", ""))
def test_parity_with_one_query_head_per_kernel_call(dist_pool, world, algo, opts, case):
    """``heads_per_call=1`` under the ring-style backends (every kernel call, forward and backward, holds one query
    head; GQA / MQA heads share their K/V head and add their dK/dV): out, dq, dk, dv equal single-device float64
    attention within the unsplit tolerance, on 2 and 3 ranks."""
    for rank, (errs, most) in enumerate(dist_pool(world).run(heads_per_call_worker, algo, opts, CASES[case],
                                                             "float32")):  # fmt: skip
        assert most == 1, f"rank {rank}: a kernel call held {most} query heads"
        assert max(errs.values()) < TOL["float32"], f"rank {rank}: {errs}"
